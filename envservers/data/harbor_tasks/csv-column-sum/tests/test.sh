#!/bin/bash
# Reward 1 if total.py prints the column's sum, also on a second file the agent never saw.
score=0
out=$(cd /repo && timeout 20 python total.py 2>/dev/null | tr -d '[:space:]')
[ "$out" = "74.50" ] || [ "$out" = "74.5" ] && score=$((score + 1))
mkdir -p /tmp/other && cp /repo/total.py /tmp/other/ && cp /tests/other_sales.csv /tmp/other/sales.csv
out=$(cd /tmp/other && timeout 20 python total.py 2>/dev/null | tr -d '[:space:]')
[ "$out" = "1001.00" ] || [ "$out" = "1001.0" ] || [ "$out" = "1001" ] && score=$((score + 1))
python -c "print($score / 2)" > /logs/verifier/reward.txt
echo "checks passed: $score of 2"
