"""A headless Chromium driven by Selenium, one per env instance, and everything it starts killed with it.

    browser = Browser.start(width=500, height=400)
    browser.driver.get("file:///...")
    png = browser.screenshot_png((0, 0, 160, 210))      # the viewport cropped to a box, as PNG bytes
    browser.click(40, 60); browser.type_text("hello"); browser.press("Enter")
    browser.close()                                     # quit, then SIGKILL whatever is left of it

Each browser has a profile directory of its own (`--user-data-dir`); every Chromium process of the
instance (the browser, its renderers and zygotes, the crash handler that double-forks away from its
parent) carries that path on its command line, so `pids()` finds them all and `close` leaves none.
Chromium and chromedriver are Debian's (`chromium`, `chromium-driver`; .ci/setup), found on PATH
unless given; Selenium's own driver download is never used (the paths are explicit).
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import signal
import tempfile
import time

KEYS = {
  "Enter": "ENTER",
  "Tab": "TAB",
  "Backspace": "BACKSPACE",
  "Delete": "DELETE",
  "Escape": "ESCAPE",
  "Space": "SPACE",
  "ArrowUp": "ARROW_UP",
  "ArrowDown": "ARROW_DOWN",
  "ArrowLeft": "ARROW_LEFT",
  "ArrowRight": "ARROW_RIGHT",
  "Home": "HOME",
  "End": "END",
  "PageUp": "PAGE_UP",
  "PageDown": "PAGE_DOWN",
}


def find_binaries(chromium: str = "", chromedriver: str = "") -> tuple[str, str]:
  """(chromium, chromedriver) paths; RuntimeError naming what is missing and how to install it."""
  chromium = chromium or shutil.which("chromium") or shutil.which("chromium-browser") or ""
  chromedriver = chromedriver or shutil.which("chromedriver") or ""
  missing = [name for name, path in (("chromium", chromium), ("chromedriver", chromedriver)) if not path]
  if missing:
    raise RuntimeError(f"{' and '.join(missing)} not found: apt-get install -y chromium chromium-driver (.ci/setup)")
  return chromium, chromedriver


def processes_with(text: str) -> list[int]:
  """Live (not zombie) processes whose command line contains `text`."""
  found, needle = [], text.encode()
  for entry in os.listdir("/proc"):
    if not entry.isdigit():
      continue
    try:
      with open(f"/proc/{entry}/cmdline", "rb") as f:
        if needle not in f.read():
          continue
      with open(f"/proc/{entry}/stat") as f:
        if f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
          continue
    except OSError:
      continue
    found.append(int(entry))
  return found


class Browser:
  """One headless Chromium (its own profile directory) and its chromedriver."""

  def __init__(self, driver, profile_dir: str):
    self.driver = driver
    self.profile_dir = profile_dir

  @classmethod
  def start(cls, width: int, height: int, chromium: str = "", chromedriver: str = "") -> "Browser":
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium, chromedriver = find_binaries(chromium, chromedriver)
    profile_dir = tempfile.mkdtemp(prefix="envservers-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in (
      "--headless=new",
      "--no-sandbox",  # the server may run as root; the page is ours, not the open web
      "--disable-gpu",
      "--disable-dev-shm-usage",
      "--disable-extensions",
      "--no-first-run",
      "--hide-scrollbars",
      "--force-device-scale-factor=1",
      f"--window-size={width},{height}",
      f"--user-data-dir={profile_dir}",
    ):
      options.add_argument(arg)
    try:
      driver = webdriver.Chrome(service=Service(executable_path=chromedriver), options=options)
    except Exception:
      _kill_all(profile_dir)
      shutil.rmtree(profile_dir, ignore_errors=True)
      raise
    browser = cls(driver, profile_dir)
    browser.driver_pid = driver.service.process.pid
    return browser

  def pids(self) -> list[int]:
    """The live processes of this browser: chromedriver and every Chromium process of its profile."""
    pids = processes_with(self.profile_dir)
    if getattr(self, "driver_pid", None) and _alive(self.driver_pid):
      pids.append(self.driver_pid)
    return sorted(set(pids))

  def screenshot_png(self, box: tuple[int, int, int, int]) -> bytes:
    """The viewport cropped to `box` (left, top, right, bottom in CSS pixels) as PNG bytes."""
    from PIL import Image

    shot = Image.open(io.BytesIO(self.driver.get_screenshot_as_png())).convert("RGB")
    out = io.BytesIO()
    shot.crop(box).save(out, format="PNG")
    return out.getvalue()

  def click(self, x: int, y: int) -> None:
    """A real mouse click at viewport point (x, y)."""
    from selenium.webdriver.common.actions.action_builder import ActionBuilder

    actions = ActionBuilder(self.driver)
    actions.pointer_action.move_to_location(int(x), int(y))
    actions.pointer_action.click()
    actions.perform()

  def type_text(self, text: str) -> None:
    """Key presses of `text` into the focused element."""
    from selenium.webdriver.common.action_chains import ActionChains

    ActionChains(self.driver).send_keys(text).perform()

  def press(self, name: str) -> None:
    """One named key (KEYS); ValueError listing the names for another."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    if name not in KEYS:
      raise ValueError(f"unknown key {name!r}; keys: {sorted(KEYS)}")
    ActionChains(self.driver).send_keys(getattr(Keys, KEYS[name])).perform()

  def close(self) -> None:
    """Quits the browser, then SIGKILLs whatever of it is left and removes its profile. Never raises."""
    with contextlib.suppress(Exception):
      self.driver.quit()
    deadline = time.monotonic() + 2.0
    while self.pids() and time.monotonic() < deadline:
      time.sleep(0.05)
    _kill_all(self.profile_dir, getattr(self, "driver_pid", None))
    shutil.rmtree(self.profile_dir, ignore_errors=True)


def _alive(pid: int) -> bool:
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
  except OSError:
    return False


def _kill_all(profile_dir: str, driver_pid: int | None = None) -> None:
  pids = processes_with(profile_dir) + ([driver_pid] if driver_pid and _alive(driver_pid) else [])
  for pid in pids:
    with contextlib.suppress(ProcessLookupError, PermissionError):
      os.kill(pid, signal.SIGKILL)
  deadline = time.monotonic() + 2.0
  while any(_alive(p) for p in pids) and time.monotonic() < deadline:
    time.sleep(0.02)
