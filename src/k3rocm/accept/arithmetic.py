"""Arithmetic word problems with exact whole-number answers, generated from a
seed (no data set to download), the scorer that reads a reply's final number,
and the Wilson 95 % interval of an accuracy."""

from __future__ import annotations

import math
import random
import re
from collections.abc import Callable
from dataclasses import dataclass

INSTRUCTION = (
    "Solve the problem. Give the result as a whole number on the last line, "
    "written as `Answer: <number>`."
)


@dataclass(frozen=True)
class Problem:
    text: str
    answer: int


NAMES = ("Ada", "Bruno", "Chen", "Dara", "Emil", "Farah", "Goran", "Hana")


def _sell_remaining(rng: random.Random) -> Problem:
    boxes, per_box = rng.randint(3, 60), rng.randint(2, 24)
    sold = rng.randint(0, boxes * per_box)
    name = rng.choice(NAMES)
    return Problem(
        f"{name} packs {boxes} boxes with {per_box} apples in each box, then "
        f"sells {sold} apples. How many apples does {name} have left?",
        boxes * per_box - sold,
    )


def _shared_equally(rng: random.Random) -> Problem:
    friends, each = rng.randint(2, 12), rng.randint(3, 90)
    kept = rng.randint(1, 400)
    name = rng.choice(NAMES)
    return Problem(
        f"{name} has {friends * each + kept} stickers, keeps {kept} of them "
        f"and shares the rest equally among {friends} friends. How many "
        f"stickers does each friend get?",
        each,
    )


def _trip_distance(rng: random.Random) -> Problem:
    days, per_day = rng.randint(2, 14), rng.randint(20, 480)
    detour = rng.randint(5, 300)
    return Problem(
        f"A truck drives {per_day} km every day for {days} days and makes one "
        f"extra detour of {detour} km. How many kilometres does it drive in "
        f"total?",
        days * per_day + detour,
    )


def _shop_change(rng: random.Random) -> Problem:
    count, price = rng.randint(2, 30), rng.randint(3, 150)
    paid = count * price + rng.randint(0, 999)
    name = rng.choice(NAMES)
    return Problem(
        f"{name} buys {count} notebooks at {price} coins each and pays with "
        f"{paid} coins. How many coins of change does {name} get?",
        paid - count * price,
    )


def _rows_and_gaps(rng: random.Random) -> Problem:
    rows, seats = rng.randint(4, 70), rng.randint(5, 45)
    empty = rng.randint(0, rows * seats)
    return Problem(
        f"A hall has {rows} rows of {seats} seats. At a concert {empty} seats "
        f"stay empty. How many people sit in the hall?",
        rows * seats - empty,
    )


TEMPLATES: tuple[Callable[[random.Random], Problem], ...] = (
    _sell_remaining,
    _shared_equally,
    _trip_distance,
    _shop_change,
    _rows_and_gaps,
)


def problems(count: int, seed: int) -> list[Problem]:
    """``count`` problems, the same for the same seed on every machine. A
    problem whose last number is its answer is drawn again: a reply that only
    echoes the problem must not score."""
    rng = random.Random(seed)
    drawn: list[Problem] = []
    while len(drawn) < count:
        problem = rng.choice(TEMPLATES)(rng)
        if final_number(problem.text) != problem.answer:
            drawn.append(problem)
    return drawn


# A number as replies write one: digits with optional thousands separators
# (comma, thin space, underscore or apostrophe between groups of three) and an
# optional decimal part; a minus sign directly before it counts.
_NUMBER = re.compile(
    r"(?<![\w.])(-?)(\d{1,3}(?:[,'_\u2009\u202f]\d{3})+|\d+)(?:\.(\d+))?(?![\w])"
)
_ANSWER_LINE = re.compile(r"answer[\s:=]{0,6}", re.IGNORECASE)


def _value(match: re.Match) -> int | None:
    sign, whole, fraction = match.groups()
    if fraction and fraction.strip("0"):
        return None  # not a whole number: never equal to a whole answer
    value = int(re.sub(r"\D", "", whole))
    return -value if sign else value


def final_number(reply: str) -> int | None:
    """The reply's final answer: the first number after its last ``Answer``
    (``Answer: 1,234``, ``**Answer:** $1234.00``), else its last number;
    None when it has none, or when that number is not whole."""
    text = reply.replace("**", "")
    marks = list(_ANSWER_LINE.finditer(text))
    if marks:
        after = _NUMBER.search(text, marks[-1].end())
        if after:
            return _value(after)
    numbers = list(_NUMBER.finditer(text))
    return _value(numbers[-1]) if numbers else None


def is_correct(reply: str, answer: int) -> bool:
    return final_number(reply) == answer


@dataclass(frozen=True)
class Interval:
    low: float
    high: float


def wilson(correct: int, total: int, z: float = 1.959964) -> Interval:
    """The Wilson score interval of correct/total (95 % by default)."""
    if total <= 0 or not 0 <= correct <= total:
        raise ValueError(f"no interval for {correct} of {total}")
    p = correct / total
    denominator = 1 + z * z / total
    centre = (p + z * z / (2 * total)) / denominator
    half = (
        z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / denominator
    )
    # At 0 and at total the bounds are exactly 0 and 1 (rounding aside).
    low = 0.0 if correct == 0 else max(0.0, centre - half)
    high = 1.0 if correct == total else min(1.0, centre + half)
    return Interval(low, high)
