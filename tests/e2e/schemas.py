"""Twenty JSON schemas held out from the engine's development (nested objects, arrays, enums,
bounded numbers, required fields, $defs, anyOf), each with a chat prompt that asks for it."""

from __future__ import annotations

NAME = {"type": "string", "minLength": 1, "maxLength": 24}
SHORT = {"type": "string", "maxLength": 40}


def obj(required: list[str], **props) -> dict:
    return {
        "type": "object",
        "properties": props,
        "required": required,
        "additionalProperties": False,
    }


SCHEMAS: list[tuple[str, dict]] = [
    (
        "Describe a person.",
        obj(["name", "age"], name=NAME, age={"type": "integer", "minimum": 0, "maximum": 120}),
    ),
    ("Give a city and its country.", obj(["city", "country"], city=NAME, country=NAME)),
    (
        "Rate a movie from 1 to 5.",
        obj(["title", "stars"], title=NAME, stars={"type": "integer", "minimum": 1, "maximum": 5}),
    ),
    ("Pick a primary color.", obj(["color"], color={"enum": ["red", "green", "blue"]})),
    (
        "List three fruits.",
        obj(["fruits"], fruits={"type": "array", "items": NAME, "minItems": 3, "maxItems": 3}),
    ),
    (
        "Give a temperature in Celsius.",
        obj(["celsius"], celsius={"type": "number", "minimum": -50, "maximum": 60}),
    ),
    (
        "Is water wet? Answer with a boolean and a reason.",
        obj(["answer", "reason"], answer={"type": "boolean"}, reason=SHORT),
    ),
    (
        "Describe a book with its author.",
        obj(["title", "author"], title=NAME, author=obj(["first", "last"], first=NAME, last=NAME)),
    ),
    (
        "Give a 2D point.",
        obj(
            ["x", "y"],
            x={"type": "number", "minimum": -10, "maximum": 10},
            y={"type": "number", "minimum": -10, "maximum": 10},
        ),
    ),
    (
        "Name a weekday and whether it is a weekend day.",
        obj(
            ["day", "weekend"],
            day={
                "enum": [
                    "Monday",
                    "Tuesday",
                    "Wednesday",
                    "Thursday",
                    "Friday",
                    "Saturday",
                    "Sunday",
                ]
            },
            weekend={"type": "boolean"},
        ),
    ),
    (
        "Write a shopping list with quantities.",
        obj(
            ["items"],
            items={
                "type": "array",
                "maxItems": 4,
                "items": obj(
                    ["name", "qty"], name=NAME, qty={"type": "integer", "minimum": 1, "maximum": 12}
                ),
            },
        ),
    ),
    (
        "Give an HTTP status code and its meaning.",
        obj(
            ["code", "meaning"],
            code={"type": "integer", "minimum": 100, "maximum": 599},
            meaning=SHORT,
        ),
    ),
    (
        "Describe the weather.",
        obj(
            ["sky", "wind_kmh"],
            sky={"enum": ["clear", "cloudy", "rain"]},
            wind_kmh={"type": "integer", "minimum": 0, "maximum": 200},
        ),
    ),
    (
        "Give an ID or say it is unknown.",
        obj(
            ["id"],
            id={"anyOf": [{"type": "integer", "minimum": 1, "maximum": 9999}, {"type": "null"}]},
        ),
    ),
    (
        "Name two planets and their order from the sun.",
        obj(
            ["planets"],
            planets={
                "type": "array",
                "minItems": 2,
                "maxItems": 2,
                "items": {"$ref": "#/$defs/planet"},
            },
        )
        | {
            "$defs": {
                "planet": obj(
                    ["name", "order"],
                    name=NAME,
                    order={"type": "integer", "minimum": 1, "maximum": 8},
                )
            }
        },
    ),
    (
        "Give a version number.",
        obj(
            ["major", "minor", "patch"],
            **{
                k: {"type": "integer", "minimum": 0, "maximum": 99}
                for k in ("major", "minor", "patch")
            },
        ),
    ),
    (
        "Give a date.",
        obj(["date"], date={"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"}),
    ),
    (
        "Describe a pet, optionally with its age.",
        obj(
            ["species"],
            species={"enum": ["cat", "dog", "fish"]},
            age={"type": "integer", "minimum": 0, "maximum": 30},
        ),
    ),
    (
        "Give a score and a grade.",
        obj(
            ["score", "grade"],
            score={"type": "number", "exclusiveMinimum": 0, "maximum": 100},
            grade={"enum": list("ABCDF")},
        ),
    ),
    (
        "Name a team with two members and their roles.",
        obj(
            ["team", "members"],
            team=NAME,
            members={
                "type": "array",
                "minItems": 2,
                "maxItems": 2,
                "items": obj(["name", "role"], name=NAME, role={"enum": ["lead", "dev", "qa"]}),
            },
        ),
    ),
]
