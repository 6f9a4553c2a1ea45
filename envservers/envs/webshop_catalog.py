"""The shop's products and instructions: a seeded generated catalog, or WebShop's own files.

A product is a dict:
  asin: id ("B0" + 8 characters), name: title, query: its product type (e.g. "running shoes"),
  category: "top › sub › type", attributes: [str] (e.g. "machine washable"),
  options: {option name: [values]} (e.g. {"size": ["small", "large"], "color": [...]}),
  price: float, description: str, features: [str].
A goal (what an instruction asks for) is a dict:
  asin, name, query, category, attributes: [str] (a subset of the product's), goal_options:
  {option name: value}, price_upper: float (> the product's price), instruction_text: str.

`generate_catalog(num_products, seed)` makes products; `make_goals(products, n, seed)` draws goals
from them; `load_webshop_products(items_path, attributes_path)` reads WebShop's
`items_shuffle.json` (+ `items_ins_v2.json`) layout.
"""

from __future__ import annotations

import json
import re

import numpy as np

# top category -> sub category -> {product type: (attributes pool, option names, price range)}
_CATALOG_SPEC = {
  "clothing": {
    "men": {
      "t-shirt": (
        ["machine washable", "cotton", "slim fit", "short sleeve", "moisture wicking", "quick dry", "regular fit"],
        ["size", "color"],
        (8, 40),
      ),
      "jeans": (
        ["stretch", "slim fit", "button closure", "machine washable", "relaxed fit", "denim"],
        ["size", "color"],
        (20, 90),
      ),
      "hoodie": (
        ["fleece", "machine washable", "long sleeve", "drawstring", "zip up", "pullover"],
        ["size", "color"],
        (18, 70),
      ),
    },
    "women": {
      "dress": (
        ["machine washable", "midi length", "floral print", "sleeveless", "v neck", "pockets"],
        ["size", "color"],
        (15, 120),
      ),
      "leggings": (
        ["high waist", "tummy control", "stretch", "squat proof", "pockets", "quick dry"],
        ["size", "color"],
        (10, 45),
      ),
      "blouse": (
        ["long sleeve", "button down", "chiffon", "loose fit", "v neck", "machine washable"],
        ["size", "color"],
        (12, 60),
      ),
    },
    "shoes": {
      "running shoes": (
        ["non slip", "lightweight", "breathable mesh", "rubber sole", "memory foam", "arch support"],
        ["size", "color"],
        (25, 150),
      ),
      "sandals": (
        ["open toe", "ankle strap", "non slip", "rubber sole", "arch support", "waterproof"],
        ["size", "color"],
        (12, 80),
      ),
      "boots": (
        ["waterproof", "lace up", "rubber sole", "faux fur lined", "steel toe", "non slip"],
        ["size", "color"],
        (35, 200),
      ),
    },
  },
  "home and kitchen": {
    "bedding": {
      "pillow": (
        ["memory foam", "hypoallergenic", "machine washable", "cooling gel", "down alternative", "adjustable loft"],
        ["size", "count"],
        (15, 90),
      ),
      "sheet set": (
        ["deep pocket", "microfiber", "wrinkle free", "cotton", "breathable", "machine washable"],
        ["size", "color"],
        (20, 120),
      ),
    },
    "kitchen": {
      "water bottle": (
        ["bpa free", "leak proof", "insulated", "stainless steel", "dishwasher safe", "wide mouth"],
        ["capacity", "color"],
        (8, 45),
      ),
      "coffee mug": (
        ["dishwasher safe", "microwave safe", "ceramic", "insulated", "lid included", "large capacity"],
        ["capacity", "color"],
        (6, 35),
      ),
      "cutting board": (
        ["bamboo", "non slip", "dishwasher safe", "juice groove", "reversible", "bpa free"],
        ["size", "count"],
        (10, 60),
      ),
    },
  },
  "beauty and personal care": {
    "skin care": {
      "face moisturizer": (
        ["fragrance free", "paraben free", "hyaluronic acid", "sensitive skin", "spf 30", "cruelty free"],
        ["scent", "size"],
        (7, 65),
      ),
      "sunscreen": (
        ["water resistant", "reef safe", "spf 50", "oil free", "fragrance free", "mineral based"],
        ["size", "count"],
        (6, 40),
      ),
    },
    "hair care": {
      "shampoo": (
        ["sulfate free", "paraben free", "color safe", "natural ingredients", "anti dandruff", "cruelty free"],
        ["scent", "size"],
        (5, 45),
      ),
      "hair dryer": (
        ["ionic", "lightweight", "fast drying", "low noise", "diffuser included", "foldable handle"],
        ["color", "style"],
        (20, 160),
      ),
    },
  },
  "electronics": {
    "audio": {
      "wireless earbuds": (
        ["noise cancelling", "bluetooth", "water resistant", "long battery life", "charging case", "touch control"],
        ["color", "style"],
        (15, 250),
      ),
      "portable speaker": (
        ["bluetooth", "waterproof", "long battery life", "high fidelity", "built in microphone", "lightweight"],
        ["color", "style"],
        (18, 200),
      ),
    },
    "accessories": {
      "phone case": (
        ["shockproof", "slim fit", "wireless charging compatible", "raised edges", "clear", "kickstand"],
        ["color", "style"],
        (6, 40),
      ),
      "usb cable": (
        ["fast charging", "braided", "durable", "high speed data transfer", "tangle free", "gold plated"],
        ["size", "count"],
        (5, 30),
      ),
    },
  },
  "grocery": {
    "snacks": {
      "protein bar": (
        ["gluten free", "high protein", "low sugar", "non gmo", "keto friendly", "vegan"],
        ["flavor", "count"],
        (8, 50),
      ),
      "trail mix": (
        ["gluten free", "non gmo", "resealable bag", "natural ingredients", "high protein", "no artificial colors"],
        ["flavor", "size"],
        (6, 35),
      ),
    },
    "beverages": {
      "green tea": (
        ["organic", "caffeine free", "non gmo", "natural ingredients", "individually wrapped", "gluten free"],
        ["flavor", "count"],
        (5, 30),
      ),
      "coffee beans": (
        ["whole bean", "organic", "fair trade", "dark roast", "medium roast", "single origin"],
        ["flavor", "size"],
        (9, 45),
      ),
    },
  },
}

_OPTION_VALUES = {
  "size": [
    "x-small",
    "small",
    "medium",
    "large",
    "x-large",
    "xx-large",
    "6",
    "7",
    "8",
    "9",
    "10",
    "11",
    "twin",
    "full",
    "queen",
    "king",
    "3 feet",
    "6 feet",
    "10 feet",
  ],
  "color": [
    "black",
    "white",
    "navy blue",
    "red",
    "green",
    "grey",
    "pink",
    "beige",
    "brown",
    "purple",
    "yellow",
    "light blue",
  ],
  "count": ["1 count", "2 count", "4 count", "6 count", "12 count", "24 count"],
  "capacity": ["12 ounce", "16 ounce", "20 ounce", "24 ounce", "32 ounce", "40 ounce"],
  "scent": ["unscented", "lavender", "coconut", "citrus", "vanilla", "eucalyptus"],
  "flavor": ["chocolate", "peanut butter", "vanilla", "mixed berry", "original", "caramel", "mint", "honey"],
  "style": ["standard", "pro", "mini", "plus", "sport", "classic"],
}

_BRANDS = [
  "Acme",
  "Northwind",
  "Brightly",
  "Kestrel",
  "Lumen",
  "Orchard",
  "Pinecrest",
  "Quill",
  "Riverstone",
  "Solace",
  "Tidewater",
  "Verdant",
  "Willowby",
  "Zephyr",
  "Amberly",
  "Cobalt",
  "Driftwood",
  "Everpeak",
  "Foxglove",
  "Granite",
]
_ADJECTIVES = [
  "classic",
  "premium",
  "everyday",
  "ultra",
  "essential",
  "comfort",
  "deluxe",
  "eco",
  "urban",
  "outdoor",
  "modern",
  "vintage",
]
_FIELDS = ("asin", "name", "query", "category", "attributes", "options", "price")


def _product_types() -> list[tuple[str, str, str, tuple]]:
  return [
    (top, sub, ptype, spec)
    for top, subs in _CATALOG_SPEC.items()
    for sub, types in subs.items()
    for ptype, spec in types.items()
  ]


DEFAULT_NUM_PRODUCTS = 1000  # the env server's and the trainer-side task's catalog, one home
DEFAULT_CATALOG_SEED = 0


def generate_catalog(num_products: int = DEFAULT_NUM_PRODUCTS, seed: int = DEFAULT_CATALOG_SEED) -> list[dict]:
  """`num_products` products (seeded: the same arguments give the same catalog)."""
  if not isinstance(num_products, int) or num_products < 1:
    raise ValueError(f"num_products must be a positive int, got {num_products!r}")
  rng = np.random.default_rng([seed, 7919])
  types = _product_types()
  products = []
  for i in range(num_products):
    top, sub, ptype, (attr_pool, option_names, (low, high)) = types[i % len(types)]
    attributes = sorted(rng.choice(attr_pool, size=int(rng.integers(2, 5)), replace=False).tolist())
    options = {}
    for option in option_names:
      values = _OPTION_VALUES[option]
      k = int(rng.integers(2, min(6, len(values)) + 1))
      picked = rng.choice(len(values), size=k, replace=False)
      options[option] = [values[j] for j in sorted(picked)]
    brand = _BRANDS[int(rng.integers(len(_BRANDS)))]
    adjective = _ADJECTIVES[int(rng.integers(len(_ADJECTIVES)))]
    name = f"{brand} {adjective} {ptype}, {attributes[0]}"
    price = round(float(rng.uniform(low, high)), 2)
    asin = "B0" + "".join(rng.choice(list("ABCDEFGHJKLMNPQRSTUVWXYZ0123456789"), size=8))
    products.append(
      {
        "asin": asin,
        "name": name,
        "query": ptype,
        "category": f"{top} › {sub} › {ptype}",
        "attributes": attributes,
        "options": options,
        "price": price,
        "description": f"The {brand} {ptype}: {', '.join(attributes)}.",
        "features": [f"{a.capitalize()}." for a in attributes] + [f"By {brand}."],
      }
    )
  _check_unique(products, f"generate_catalog(seed={seed})")
  return products


def _check_unique(products: list[dict], source: str) -> None:
  seen = set()
  for p in products:
    if p["asin"] in seen:
      raise ValueError(f"{source}: product id {p['asin']!r} occurs twice")
    seen.add(p["asin"])


def instruction_text(goal: dict) -> str:
  """WebShop-style instruction for a goal."""
  text = f"i need a {goal['query']}"
  if goal["attributes"]:
    text += " that is " + " and ".join(goal["attributes"])
  if goal["goal_options"]:
    text += ", with " + " and ".join(f"{k}: {v}" for k, v in sorted(goal["goal_options"].items()))
  return text + f", and price lower than {goal['price_upper']:.2f} dollars"


def make_goals(products: list[dict], n: int, seed: int) -> list[dict]:
  """n goals drawn from `products` (seeded): a product, 1-3 of its attributes, one value per
  option, and a price bound 10-100 % above its price."""
  rng = np.random.default_rng([seed, 104729])
  goals = []
  for index in rng.integers(len(products), size=n):
    p = products[int(index)]
    k = min(len(p["attributes"]), int(rng.integers(1, 4)))
    attributes = sorted(rng.choice(p["attributes"], size=k, replace=False).tolist()) if k else []
    goal_options = {name: values[int(rng.integers(len(values)))] for name, values in p["options"].items() if values}
    price_upper = float(np.ceil(p["price"] * rng.uniform(1.1, 2.0)))
    goal = {
      "asin": p["asin"],
      "name": p["name"],
      "query": p["query"],
      "category": p["category"],
      "attributes": attributes,
      "goal_options": goal_options,
      "price_upper": price_upper,
    }
    goal["instruction_text"] = instruction_text(goal)
    goals.append(goal)
  return goals


def _price(value, where: str) -> float:
  if isinstance(value, (int, float)) and not isinstance(value, bool):
    return float(value)
  numbers = re.findall(r"\d+(?:\.\d+)?", str(value or "").replace(",", ""))
  if not numbers:
    raise ValueError(f"{where}: field 'pricing' has no price: {value!r:.60}")
  return float(numbers[0])


def load_webshop_products(items_path: str, attributes_path: str | None = None) -> list[dict]:
  """Products from WebShop's `items_shuffle.json` (a JSON list of items with asin, name,
  product_category, query, pricing, customization_options, small_description / full_description)
  and optionally `items_ins_v2.json` ({asin: {"attributes": [...], ...}})."""
  with open(items_path) as f:
    items = json.load(f)
  if not isinstance(items, list):
    raise ValueError(f"{items_path}: expected a JSON list of products, got {type(items).__name__}")
  attributes_by_asin = {}
  if attributes_path:
    with open(attributes_path) as f:
      attributes_by_asin = json.load(f)
    if not isinstance(attributes_by_asin, dict):
      raise ValueError(f"{attributes_path}: expected a JSON object keyed by asin")
  products = []
  for i, item in enumerate(items):
    where = f"{items_path}: item {i}"
    if not isinstance(item, dict):
      raise ValueError(f"{where}: expected an object, got {type(item).__name__}")
    for field in ("asin", "name"):
      if not isinstance(item.get(field), str) or not item[field]:
        raise ValueError(f"{where}: field {field!r} must be a non-empty string")
    options = {}
    for name, values in (item.get("customization_options") or {}).items():
      options[name.lower()] = [str(v["value"] if isinstance(v, dict) else v).lower() for v in values or []]
    description = item.get("full_description") or item.get("small_description") or ""
    if isinstance(description, list):
      description = " ".join(map(str, description))
    features = item.get("small_description") or []
    features = [str(x) for x in features] if isinstance(features, list) else [str(features)]
    products.append(
      {
        "asin": item["asin"],
        "name": item["name"],
        "query": str(item.get("query") or "").lower(),
        "category": str(item.get("product_category") or ""),
        "attributes": [str(a).lower() for a in (attributes_by_asin.get(item["asin"]) or {}).get("attributes", [])],
        "options": options,
        "price": _price(item.get("pricing"), where),
        "description": str(description),
        "features": features,
      }
    )
  _check_unique(products, items_path)
  return products
