"""Checks of top_words; writes the share passing to /logs/verifier/reward.txt."""

import sys

sys.path.insert(0, "/repo")
CHECKS = [
  ("the cat and the hat", 2, [("the", 2), ("and", 1)]),
  ("B a b A c", 3, [("a", 2), ("b", 2), ("c", 1)]),
  ("Stop. stop, STOP! go", 1, [("stop", 3)]),
  ("one", 5, [("one", 1)]),
]
passed = 0
try:
  from wordcount import top_words

  for text, n, want in CHECKS:
    try:
      got = top_words(text, n)
    except Exception as e:  # noqa: BLE001
      got = e
    passed += got == want
    print("ok " if got == want else "FAIL", text, n, got)
except Exception as e:  # noqa: BLE001
  print("import failed:", e)
with open("/logs/verifier/reward.txt", "w") as f:
  f.write(f"{passed / len(CHECKS)}\n")
