(define (problem tinyhouse-apple)
 (:domain tinyhouse)
 (:objects
    agent1 - agent
    loc_door loc_table loc_shelf - location
    table shelf - receptacle
    apple - object)
 (:init
    (atLocation agent1 loc_door)
    (receptacleAtLocation table loc_table)
    (receptacleAtLocation shelf loc_shelf)
    (inReceptacle apple table))
 (:goal (inReceptacle apple shelf))
)
