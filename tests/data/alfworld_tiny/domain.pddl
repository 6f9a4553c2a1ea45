;; A tiny household domain in the style of ALFWorld's (written for this test): walk between
;; receptacles, take an object from one, put it in another.
(define (domain tinyhouse)
 (:requirements :adl :typing)
 (:types agent location receptacle object)
 (:predicates
    (atLocation ?a - agent ?l - location)
    (receptacleAtLocation ?r - receptacle ?l - location)
    (inReceptacle ?o - object ?r - receptacle)
    (holds ?a - agent ?o - object)
    (holdsAny ?a - agent)
    (checked ?r - receptacle))

 (:action look
    :parameters (?a - agent ?l - location)
    :precondition (atLocation ?a ?l)
    :effect (and))

 (:action examineReceptacle
    :parameters (?a - agent ?r - receptacle)
    :precondition (exists (?l - location) (and (atLocation ?a ?l) (receptacleAtLocation ?r ?l)))
    :effect (checked ?r))

 (:action GotoLocation
    :parameters (?a - agent ?lStart - location ?lEnd - location ?r - receptacle)
    :precondition (and (atLocation ?a ?lStart) (receptacleAtLocation ?r ?lEnd))
    :effect (and (not (atLocation ?a ?lStart)) (atLocation ?a ?lEnd)))

 (:action PickupObject
    :parameters (?a - agent ?l - location ?o - object ?r - receptacle)
    :precondition (and (atLocation ?a ?l) (receptacleAtLocation ?r ?l) (inReceptacle ?o ?r)
                       (not (holdsAny ?a)))
    :effect (and (not (inReceptacle ?o ?r)) (holds ?a ?o) (holdsAny ?a)))

 (:action PutObject
    :parameters (?a - agent ?l - location ?o - object ?r - receptacle)
    :precondition (and (holds ?a ?o) (atLocation ?a ?l) (receptacleAtLocation ?r ?l))
    :effect (and (inReceptacle ?o ?r) (not (holds ?a ?o)) (not (holdsAny ?a))))
)
