"""Word pools shared by the synthetic tasks (fixed, so generation stays deterministic)."""

from __future__ import annotations

PLACES: tuple[str, ...] = (
    "Harbor Park", "North Pier", "Central Station", "Airport East", "River Bridge",
    "City Stadium", "Old Town", "West Gate", "Hill Farm", "Lake Dam",
    "Power Plant", "City Hall", "South Port", "Pine Forest", "Grand Mall",
    "Fire Depot", "Rail Yard", "Green Valley", "Market Square", "Water Works",
    "East Tower", "Sea Wall", "Main Hospital", "Stone Quarry",
)

FIRST_NAMES: tuple[str, ...] = (
    "Ana", "Ben", "Cai", "Dev", "Eva", "Fay", "Gus", "Hal",
    "Ivy", "Jon", "Kim", "Leo", "Mia", "Ned", "Ola", "Raj",
)

SURNAMES: tuple[str, ...] = (
    "Li", "Wang", "Smith", "Khan", "Ito", "Silva", "Novak", "Chen",
    "Garcia", "Lee", "Moreau", "Park", "Zhou", "Brown", "Sato", "Costa",
)

DRONE_MODELS: tuple[str, ...] = (
    "Hawk", "Falcon", "Kite", "Swift", "Heron", "Raven", "Osprey", "Wren",
)

PURPOSES: tuple[str, ...] = (
    "survey", "delivery", "inspection", "mapping", "filming", "search", "patrol", "spraying",
)
