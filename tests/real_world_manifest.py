"""A tool definition as published manifests write it, shared by the stub generator's tests and
the served ones: a parameter name that is a Python identifier but not ASCII, one with a ligature
(an identifier Python reads in its NFKC form, ``ficha``), and an ``enum`` written at an array's
level instead of its items'."""

from __future__ import annotations

from typing import Any

LIGATURE = "\ufb01cha"  # "ﬁcha": an identifier, which Python reads as "ficha"
MANIFEST: list[dict[str, Any]] = [
    {
        "name": "cotizar_vehículo",
        "description": "Cotiza un seguro.",
        "parameters": {
            "type": "object",
            "properties": {
                "año_vehiculo": {"type": "integer"},
                LIGATURE: {"type": "string"},
                "acciones": {
                    "type": "array",
                    "items": {"type": "string"},
                    "enum": ["view", "edit"],
                },
            },
            "required": ["año_vehiculo"],
        },
    }
]
# What the tool receives from a script that writes the names as the model was shown them.
SENT = {"año_vehiculo": 2019, LIGATURE: "F-1", "acciones": ["view"]}
