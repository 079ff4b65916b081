"""The GUI tasks: seeded layouts of the Tk application per family, the goal, and its checker (gui.py)."""

from __future__ import annotations

import hashlib
import random
from typing import Any, Sequence

WIDTH, HEIGHT = 448, 336
FAMILIES = ("form", "button", "menu", "copy")

_FIELDS = ("Name", "City", "Email", "Phone", "Country", "Company", "Street", "Zip")
_VALUES = {"Name": ("Alice", "Bruno", "Chen", "Dana", "Emil", "Farah", "Goran", "Hana"),
           "City": ("Paris", "Lima", "Oslo", "Kyoto", "Cairo", "Quito", "Perth", "Turin"),
           "Email": ("a@x.org", "bob@mail.com", "kim@ex.net", "li@web.io", "mo@site.fr"),
           "Phone": ("555-0142", "555-0199", "555-7731", "555-2046", "555-6610"),
           "Country": ("Peru", "Chile", "Japan", "Ghana", "Spain", "Nepal"),
           "Company": ("Acme", "Globex", "Initech", "Umbrella", "Hooli"),
           "Street": ("Elm St 4", "Oak Rd 17", "Main St 9", "Pine Ave 2"),
           "Zip": ("10115", "75001", "02139", "94110", "60614")}
_BUTTONS = ("Save", "Delete", "Print", "Open", "Close", "Help", "Apply", "Reset", "Cancel", "Export", "Import",
            "Refresh", "Share", "Undo", "Redo", "Send")
_MENUS = {"Color": ("Red", "Green", "Blue", "Yellow", "Black", "White", "Orange"),
          "Size": ("Small", "Medium", "Large", "Huge", "Tiny"),
          "Font": ("Serif", "Sans", "Mono", "Script", "Display"),
          "Speed": ("Slow", "Normal", "Fast", "Turbo"),
          "Shape": ("Circle", "Square", "Triangle", "Star", "Hexagon")}
_ROW_H, _ROW0 = 48, 14


def _w(name, kind, x, y, w, h, **kw) -> dict[str, Any]:
    return {"name": name, "kind": kind, "x": int(x), "y": int(y), "w": int(w), "h": int(h), **kw}


def _rows(rng: random.Random, n: int) -> list[int]:
    return [_ROW0 + r * _ROW_H for r in sorted(rng.sample(range(6), n))]


def generate_task(family: str, rng: random.Random) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """(prompt, app spec, goal) of one task."""
    if family == "form":
        fields = rng.sample(_FIELDS, rng.randint(2, 3))
        rows = _rows(rng, len(fields) + 1)
        x0, ew = rng.randint(8, 100), rng.randint(150, 220)
        widgets, goal = [], {}
        for f, y in zip(fields, rows):
            widgets.append(_w(f"label_{f}", "label", x0, y, 84, 28, text=f + ":"))
            widgets.append(_w(f"entry_{f}", "entry", x0 + 90, y, ew, 28))
            goal[f"entry_{f}"] = rng.choice(_VALUES[f])
        widgets.append(_w("submit", "button", rng.randint(x0, x0 + 90 + ew - 90), rows[-1], 90, 32, text="Submit"))
        wanted = " and ".join(f"{f} to '{goal['entry_' + f]}'" for f in fields)
        return f"Fill in the form: set {wanted}, then press Submit.", {"widgets": widgets}, \
            {"entries": goal, "press": "submit"}
    if family == "button":
        labels = rng.sample(_BUTTONS, rng.randint(3, 5))
        cells = rng.sample([(c, r) for c in range(4) for r in range(6)], len(labels))
        widgets = [_w(f"button_{lab}", "button", 8 + c * 110 + rng.randint(0, 14), _ROW0 + r * _ROW_H, 90, 32, text=lab)
                   for lab, (c, r) in zip(labels, cells)]
        target = rng.choice(labels)
        return f"Press the {target} button.", {"widgets": widgets}, {"press": f"button_{target}"}
    if family == "menu":
        names = rng.sample(sorted(_MENUS), 2)
        xs = sorted(rng.sample(range(8, WIDTH - 130, 10), 2))
        if xs[1] - xs[0] < 130:
            xs[1] = min(xs[0] + 140, WIDTH - 124)
        y = rng.randint(8, 60)
        widgets = []
        for name, x in zip(names, xs):
            items = list(rng.sample(_MENUS[name], rng.randint(3, len(_MENUS[name]))))
            widgets.append(_w(f"menu_{name}", "menu", x, y, 116, 30, text=name, items=items))
        target_menu = rng.choice(widgets)
        item = rng.choice(target_menu["items"])
        return (f"From the {target_menu['text']} menu, choose {item}.", {"widgets": widgets},
                {"menu": target_menu["name"], "item": item, "index": target_menu["items"].index(item)})
    if family == "copy":
        code = f"{rng.choice('ABCDEFGHJKLMNPQRSTUVWXYZ')}{rng.randint(10, 99)}-{rng.randint(1000, 9999)}"
        source, target = rng.choice([("Order number", "Confirm order"), ("Invoice", "Repeat invoice"),
                                     ("Ticket", "Ticket again"), ("Serial", "Confirm serial")])
        rows = _rows(rng, 3)
        x0, ew = rng.randint(8, 80), rng.randint(140, 200)
        widgets = [_w("label_source", "label", x0, rows[0], 120, 28, text=source + ":"),
                   _w("source", "entry", x0 + 126, rows[0], ew, 28, value=code, readonly=True),
                   _w("label_target", "label", x0, rows[1], 120, 28, text=target + ":"),
                   _w("target", "entry", x0 + 126, rows[1], ew, 28),
                   _w("ok", "button", x0 + 126 + rng.randint(0, ew - 80), rows[2], 80, 32, text="OK")]
        return (f"Copy the {source} value into the {target} field, then press OK.", {"widgets": widgets},
                {"entries": {"target": code}, "press": "ok"})
    raise ValueError(f"unknown gui family {family!r}; use one of {FAMILIES}")


def is_heldout(key: str) -> bool:
    return hashlib.sha256(key.encode()).digest()[0] % 4 == 0


def center(box: Sequence[int]) -> tuple[int, int]:
    """The middle of an [x, y, w, h] box."""
    x, y, w, h = box
    return int(x + w // 2), int(y + h // 2)


def check(goal: dict[str, Any], app_state: dict[str, Any]) -> float:
    """1.0 when the application's state shows the task done, else 0.0."""
    presses = app_state.get("pressed", [])
    if "menu" in goal:
        return 1.0 if app_state.get("menu") == goal["item"] and app_state.get("menu_of") == goal["menu"] \
            and not presses else 0.0
    if "entries" in goal:  # exactly one press, of the right button, with the right values at that moment
        if len(presses) != 1 or presses[0]["name"] != goal["press"]:
            return 0.0
        return 1.0 if all(presses[0]["entries"].get(k) == v for k, v in goal["entries"].items()) else 0.0
    return 1.0 if [p["name"] for p in presses] == [goal["press"]] else 0.0


def progress(goal: dict[str, Any], app_state: dict[str, Any]) -> float:
    """The fraction of the task done in `app_state` (for step grading); 1.0 exactly when `check` is."""
    if check(goal, app_state) >= 1.0:
        return 1.0
    presses = app_state.get("pressed", [])
    if "entries" in goal and not presses:
        entries = app_state.get("entries", {})
        done = sum(entries.get(k) == v for k, v in goal["entries"].items())
        return done / (len(goal["entries"]) + 1)
    return 0.0


