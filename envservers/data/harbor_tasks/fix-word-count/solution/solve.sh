#!/bin/bash
python - <<'PY'
path = "wordcount.py"
text = open(path).read()
text = text.replace('re.findall(r"[a-z\']+", text)', 're.findall(r"[a-z\']+", text.lower())')
text = text.replace("key=lambda item: (item[1], item[0])", "key=lambda item: (-item[1], item[0])")
open(path, "w").write(text)
PY
