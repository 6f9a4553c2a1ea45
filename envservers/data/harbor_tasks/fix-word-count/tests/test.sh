#!/bin/bash
# The reward: the share of the checks in test_outputs.py that pass.
cd /repo && python /tests/test_outputs.py
