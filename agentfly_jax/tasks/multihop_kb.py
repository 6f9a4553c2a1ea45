"""A generated, fictional multi-hop knowledge base: passages + HotpotQA-style questions.

Entities (countries, cities, people, organisations, works, inventions) get seeded fictional
names and typed relations (born in, worked for, founded by, headquartered in, created by,
invented by, ...). Each entity becomes one encyclopedia-style passage {"id", "title", "text"};
a passage names related entities but never states their attributes, so a bridge question needs
two retrievals. Questions, each {"question", "answer": [gold, *aliases], "type", "hops",
"supporting_titles", "entity"}:
  - "1-hop": one relation of the named entity ("Where was Varo Keltin born?");
  - "2-hop-bridge": a relation of an entity found through another ("In which city was the creator
    of The Amber Loom born?");
  - "2-hop-comparison": both entities' years are needed ("How many years apart were A and B
    born?"; the answer is not one of the question's words, so it cannot be guessed).
Train/test are split by question entity: no entity a test question asks about is asked about in
training (comparisons pair entities of one split).

  kb = generate_kb(seed=0)                     # ~5,300 passages, ~10k questions, < 1 s
  kb.passages, kb.questions["train"], kb.questions["test"]
  parse_passage(text)                           # {relation: value} read back (the oracle uses it)

Deterministic: the same seed and scale give byte-identical output (Python's `random.Random`).
"""

from __future__ import annotations

import dataclasses
import random
import re

SYLLABLES = (
  "ka",
  "ve",
  "lo",
  "ri",
  "sen",
  "tor",
  "mal",
  "dri",
  "os",
  "ne",
  "qua",
  "bel",
  "thi",
  "gar",
  "mo",
  "zel",
  "un",
  "fa",
  "pra",
  "lin",
  "dor",
  "ce",
  "vas",
  "ho",
  "mir",
  "tu",
  "sa",
  "kel",
  "bra",
  "ny",
  "ost",
  "ru",
  "ela",
  "wen",
  "ib",
  "cor",
  "pe",
  "dal",
  "yo",
  "fen",
  "gri",
  "la",
  "nov",
  "es",
  "tam",
  "vi",
  "rho",
  "sul",
  "ak",
  "mer",
)
CITY_ENDINGS = ("vel", "mar", "holm", "port", "dun", "grad", "ford", "wick", "stad", "ora", "is")
COUNTRY_ENDINGS = ("ia", "ar", "and", "ova", "esh", "orn")
OCCUPATIONS = (
  "engineer",
  "chemist",
  "painter",
  "composer",
  "novelist",
  "astronomer",
  "architect",
  "physician",
  "mathematician",
  "botanist",
  "cartographer",
  "philosopher",
)
ORG_KINDS = (
  "Institute",
  "Company",
  "Guild",
  "Foundation",
  "Works",
  "Society",
  "Academy",
  "Press",
  "Observatory",
  "Bank",
)
ORG_FIELDS = (
  "shipbuilding",
  "optics",
  "printing",
  "textiles",
  "astronomy",
  "medicine",
  "banking",
  "railways",
  "music",
  "mapmaking",
)
WORK_KINDS = ("novel", "symphony", "painting", "treatise", "poem", "opera")
ADJECTIVES = (
  "Amber",
  "Silent",
  "Hollow",
  "Crimson",
  "Northern",
  "Glass",
  "Iron",
  "Distant",
  "Ninth",
  "Pale",
  "Burning",
  "Quiet",
  "Golden",
  "Broken",
  "Winter",
  "Salt",
  "Hidden",
  "Last",
  "Velvet",
  "Copper",
)
NOUNS = (
  "Loom",
  "Harbor",
  "Lantern",
  "Orchard",
  "Compass",
  "Tide",
  "Garden",
  "Tower",
  "Mirror",
  "River",
  "Clock",
  "Bridge",
  "Sparrow",
  "Anvil",
  "Meadow",
  "Crown",
  "Bell",
  "Field",
  "Archive",
  "Voyage",
)
DEVICES = (
  "loom",
  "engine",
  "lens",
  "pump",
  "telegraph",
  "press",
  "clock",
  "furnace",
  "compass",
  "sextant",
  "valve",
  "kiln",
  "turbine",
  "balance",
  "prism",
)
PURPOSES = (
  "weaving patterned cloth",
  "lifting water from mines",
  "measuring the height of stars",
  "sending signals along wires",
  "printing maps",
  "keeping time at sea",
  "smelting copper",
  "grinding lenses",
  "pumping air into diving bells",
  "weighing precious metals",
)

# Relation sentences: {name} is the passage's entity; other slots are relation values. A passage
# renders each relation with one of its templates; `parse_passage` reads them back.
TEMPLATES = {
  "person": [
    "{name} was a {occupation} from {nationality}.",
    "{name} was born in {birthplace} in {born}.",
    "Born in {born} in the city of {birthplace}, {name} trained as a {occupation}.",
    "{name} worked for {employer}.",
    "For most of a long career {name} was employed by {employer}.",
    "{name} died in {died}.",
  ],
  "city": [
    "{name} is a city in {country}.",
    "{name} lies on the banks of the {river} river in {country}.",
    "{name} was founded in {founded}.",
    "Settlers founded {name} in {founded}.",
    "Its population was about {population} at the last count.",
  ],
  "country": [
    "{name} is a country whose capital is {capital}.",
    "The currency of {name} is the {currency}.",
  ],
  "org": [
    "{name} is an organisation working in {field}.",
    "{name} was founded in {founded} by {founder}.",
    "{founder} established {name} in {founded}.",
    "{name} is headquartered in {headquarters}.",
    "The headquarters of {name} are in {headquarters}.",
  ],
  "work": [
    "{name} is a {kind} created by {creator} in {year}.",
    "{creator} completed the {kind} {name} in {year}.",
    "It was first published by {publisher}.",
  ],
  "invention": [
    "The {name} is a device for {purpose}.",
    "The {name} was invented by {inventor} in {year}.",
    "{inventor} built the first {name} in {year}.",
  ],
}
# relation -> templates (per kind) that carry it, choosing among alternatives by seed
_ALTERNATIVES = {
  "person": [[0], [1, 2], [3, 4], [5]],
  "city": [[0, 1], [2, 3], [4]],
  "country": [[0], [1]],
  "org": [[0], [1, 2], [3, 4]],
  "work": [[0, 1], [2]],
  "invention": [[0], [1, 2]],
}


@dataclasses.dataclass
class KnowledgeBase:
  """passages: [{"id", "title", "text"}]; entities: {name: {"kind", relations...}};
  questions: {"train": [row, ...], "test": [row, ...]}."""

  passages: list[dict]
  entities: dict[str, dict]
  questions: dict[str, list[dict]]


class _Names:
  """Unique fictional names (no collisions across all kinds)."""

  def __init__(self, rng: random.Random):
    self.rng = rng
    self.used: set[str] = set()

  def _word(self, syllables: int, ending: str = "") -> str:
    return ("".join(self.rng.choice(SYLLABLES) for _ in range(syllables)) + ending).capitalize()

  def unique(self, make) -> str:
    while True:
      name = make()
      if name not in self.used and name.lower() not in {"the", "a", "an"}:
        self.used.add(name)
        return name

  def person(self) -> str:
    return self.unique(lambda: f"{self._word(2)} {self._word(self.rng.choice((2, 3)))}")

  def city(self) -> str:
    return self.unique(lambda: self._word(self.rng.choice((1, 2)), self.rng.choice(CITY_ENDINGS)))

  def country(self) -> str:
    return self.unique(lambda: self._word(self.rng.choice((1, 2)), self.rng.choice(COUNTRY_ENDINGS)))

  def org(self) -> str:
    return self.unique(lambda: f"{self._word(2)} {self.rng.choice(ORG_KINDS)}")

  def work(self) -> str:
    r = self.rng
    return self.unique(lambda: f"The {r.choice(ADJECTIVES)} {r.choice(NOUNS)} of {self._word(2)}")

  def invention(self) -> str:
    return self.unique(lambda: f"{self._word(2)} {self.rng.choice(DEVICES)}")


def _entities(rng: random.Random, scale: float) -> dict[str, dict]:
  names = _Names(rng)
  n = lambda base: max(2, int(round(base * scale)))  # noqa: E731
  ents: dict[str, dict] = {}
  countries = [names.country() for _ in range(n(40))]
  cities = [names.city() for _ in range(n(700))]
  for c in countries:
    ents[c] = {"kind": "country", "currency": names._word(1).lower() + "mark"}
  for i, city in enumerate(cities):
    country = countries[i % len(countries)] if i < len(countries) else rng.choice(countries)
    ents[city] = {
      "kind": "city",
      "country": country,
      "founded": rng.randint(600, 1650),
      "river": names._word(2),
      "population": f"{rng.randint(2, 900) * 1000:,}",
    }
    if "capital" not in ents[country]:
      ents[country]["capital"] = city
  people = [names.person() for _ in range(n(1800))]
  for p in people:
    born = rng.randint(1700, 1930)
    city = rng.choice(cities)
    ents[p] = {
      "kind": "person",
      "born": born,
      "died": born + rng.randint(30, 90),
      "birthplace": city,
      "nationality": ents[city]["country"],
      "occupation": rng.choice(OCCUPATIONS),
    }
  orgs = []
  for _ in range(n(800)):
    hq = rng.choice(cities)
    org = names.org()
    founder = rng.choice(people)
    ents[org] = {
      "kind": "org",
      "field": rng.choice(ORG_FIELDS),
      "headquarters": hq,
      "founder": founder,
      "founded": ents[founder]["born"] + rng.randint(20, 50),
    }
    orgs.append(org)
  for p in people:
    if rng.random() < 0.8:
      ents[p]["employer"] = rng.choice(orgs)
  for _ in range(n(1200)):
    creator = rng.choice(people)
    work = names.work()
    ents[work] = {
      "kind": "work",
      "creator": creator,
      "kind_of": rng.choice(WORK_KINDS),
      "year": ents[creator]["born"] + rng.randint(18, 29),
      "publisher": rng.choice(orgs),
    }
  for _ in range(n(700)):
    inventor = rng.choice(people)
    inv = names.invention()
    ents[inv] = {
      "kind": "invention",
      "inventor": inventor,
      "purpose": rng.choice(PURPOSES),
      "year": ents[inventor]["born"] + rng.randint(20, 29),
    }
  return ents


def _render(name: str, ent: dict, rng: random.Random) -> str:
  kind = ent["kind"]
  slots = {"name": name, **{k: v for k, v in ent.items() if k != "kind"}}
  if kind == "work":
    slots["kind"] = ent["kind_of"]
  sentences = []
  for group in _ALTERNATIVES[kind]:
    template = TEMPLATES[kind][rng.choice(group)]
    try:
      sentences.append(template.format(**slots))
    except KeyError:  # the entity lacks this relation (e.g. a person with no employer)
      continue
  return " ".join(sentences)


_SLOT_PATTERNS = {
  "born": r"(?P<{}>\d{{3,4}})",
  "died": r"(?P<{}>\d{{3,4}})",
  "founded": r"(?P<{}>\d{{3,4}})",
  "year": r"(?P<{}>\d{{3,4}})",
  "population": r"(?P<{}>[\d,]+)",
}


def _slot_regex(template: str) -> re.Pattern:
  parts = re.split(r"\{(\w+)\}", template)
  pattern = ""
  for i, part in enumerate(parts):
    if i % 2 == 0:
      pattern += re.escape(part)
    else:
      pattern += _SLOT_PATTERNS.get(part, r"(?P<{}>[^.,]+?)").format(part)
  return re.compile(r"(?:^|(?<=\. ))" + pattern)


_PATTERNS = [(kind, _slot_regex(t)) for kind, ts in TEMPLATES.items() for t in ts]


def parse_passage(text: str, name: str | None = None) -> dict[str, str]:
  """Relation values read back from a passage's sentences ({"birthplace": "Ostrevel", ...}).

  With `name`, only sentences about that entity count (or about no named entity, e.g. 'It was
  first published by X.')."""
  found: dict[str, str] = {}
  for _, pattern in _PATTERNS:
    for m in pattern.finditer(text):
      values = m.groupdict()
      if name is not None and values.get("name", name) != name:
        continue
      for key, value in values.items():
        if key != "name":
          found.setdefault(key, value)
  return found


def _passages(ents: dict[str, dict], rng: random.Random) -> list[dict]:
  prefix = {"person": "p", "city": "c", "country": "n", "org": "o", "work": "w", "invention": "i"}
  counters: dict[str, int] = {}
  passages = []
  for name, ent in ents.items():
    kind = ent["kind"]
    counters[kind] = counters.get(kind, 0) + 1
    title = f"The {name}" if kind == "invention" else name
    passages.append({"id": f"{prefix[kind]}{counters[kind]:06d}", "title": title, "text": _render(name, ent, rng)})
  return passages


def _years(n: int) -> list[str]:
  return [str(n), f"{n} years"]


# question type -> (kind of the question entity, relation path, question template, answer kind)
ONE_HOP = [
  ("person", ["birthplace"], "Where was {e} born?"),
  ("person", ["born"], "In what year was {e} born?"),
  ("work", ["creator"], "Who created {e}?"),
  ("org", ["founded"], "In what year was {e} founded?"),
  ("org", ["headquarters"], "In which city is {e} headquartered?"),
  ("invention", ["inventor"], "Who invented the {e}?"),
]
BRIDGE = [
  ("work", ["creator", "birthplace"], "In which city was the creator of {e} born?"),
  ("work", ["creator", "born"], "In what year was the creator of {e} born?"),
  ("invention", ["inventor", "employer"], "Which organisation employed the inventor of the {e}?"),
  ("invention", ["inventor", "birthplace"], "Where was the inventor of the {e} born?"),
  ("org", ["founder", "birthplace"], "Where was the founder of {e} born?"),
  ("org", ["headquarters", "country"], "In which country is {e} headquartered?"),
  ("person", ["employer", "headquarters"], "In which city is the employer of {e} headquartered?"),
  ("person", ["birthplace", "founded"], "In what year was the birthplace of {e} founded?"),
  ("work", ["publisher", "founder"], "Who founded the organisation that first published {e}?"),
]
COMPARISON = [
  ("person", "born", "How many years apart were {a} and {b} born?"),
  ("org", "founded", "How many years apart were {a} and {b} founded?"),
  ("work", "year", "How many years apart were {a} and {b} created?"),
]


def _title(ents, name: str) -> str:
  return f"The {name}" if ents[name]["kind"] == "invention" else name


def _aliases(ents: dict, value) -> list[str]:
  if isinstance(value, int):
    return [str(value)]
  ent = ents.get(value, {})
  if ent.get("kind") == "city":
    return [value, f"{value}, {ent['country']}"]
  return [value]


def _follow(ents: dict, name: str, path: list[str]):
  value = name
  for relation in path:
    value = ents.get(value, {}).get(relation)
    if value is None:
      return None
  return value


def _questions(ents: dict, rng: random.Random, test_fraction: float) -> dict[str, list[dict]]:
  split_of = {name: ("test" if rng.random() < test_fraction else "train") for name in ents}
  out = {"train": [], "test": []}
  for name, ent in ents.items():
    for kind, path, template in ONE_HOP + BRIDGE:
      if ent["kind"] != kind:
        continue
      value = _follow(ents, name, path)
      if value is None:
        continue
      hops = [{"query": _title(ents, name), "relation": path[0]}] + [{"relation": r} for r in path[1:]]
      supporting = [_title(ents, name)] + ([_title(ents, _follow(ents, name, path[:1]))] if len(path) > 1 else [])
      out[split_of[name]].append(
        {
          "question": template.format(e=name),
          "answer": _aliases(ents, value),
          "type": "1-hop" if len(path) == 1 else "2-hop-bridge",
          "hops": hops,
          "supporting_titles": supporting,
          "entity": name,
        }
      )
  for kind, relation, template in COMPARISON:
    for split in ("train", "test"):
      pool = [n for n, e in ents.items() if e["kind"] == kind and split_of[n] == split]
      for _ in range(len(pool) // 2):
        a, b = rng.sample(pool, 2)
        diff = abs(ents[a][relation] - ents[b][relation])
        if diff == 0:
          continue
        out[split].append(
          {
            "question": template.format(a=a, b=b),
            "answer": _years(diff),
            "type": "2-hop-comparison",
            "hops": [{"query": a, "relation": relation}, {"query": b, "relation": relation}],
            "supporting_titles": [a, b],
            "entity": a,
          }
        )
  for rows in out.values():
    rng.shuffle(rows)
  return out


def generate_kb(seed: int = 0, scale: float = 1.0, test_fraction: float = 0.15) -> KnowledgeBase:
  """The knowledge base for `seed`; `scale` multiplies every entity count (1.0: ~5,300 passages)."""
  rng = random.Random(seed)
  ents = _entities(rng, scale)
  passages = _passages(ents, random.Random(seed + 1))
  questions = _questions(ents, random.Random(seed + 2), test_fraction)
  return KnowledgeBase(passages=passages, entities=ents, questions=questions)


def write_corpus(passages: list[dict], path: str) -> None:
  """Writes passages as JSONL (gzip when `path` ends in .gz, with a fixed header: same bytes for
  the same passages)."""
  import gzip
  import json

  data = "".join(json.dumps(p, ensure_ascii=False) + "\n" for p in passages).encode("utf-8")
  if path.endswith(".gz"):
    with open(path, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as f:
      f.write(data)
  else:
    with open(path, "wb") as f:
      f.write(data)
