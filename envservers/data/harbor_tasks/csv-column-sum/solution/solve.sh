#!/bin/bash
cat > total.py <<'PY'
import csv

with open("sales.csv", newline="") as f:
  print(f"{sum(float(row['amount']) for row in csv.DictReader(f)):.2f}")
PY
