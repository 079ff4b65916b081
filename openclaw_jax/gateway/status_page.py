"""The status page as HTML, rendered on the server from the ``/v1/status`` dict (pure functions).

No script, no style sheet or font from elsewhere: the page is one HTML document with inline CSS and
an inline SVG plot, served under a Content-Security-Policy that allows nothing else. Every text that
comes from a person or a model (session ids, reactions, hints, reasons) is HTML-escaped. Numbers a
reader (or a test) needs are also in ``data-*`` attributes and element ids.
"""

from __future__ import annotations

import datetime
import html
from typing import Any, Sequence

CSP = ("default-src 'none'; style-src 'unsafe-inline'; img-src data:; form-action 'self'; base-uri 'none'; "
       "frame-ancestors 'none'")

_STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222;max-width:80em}
h1{font-size:1.4em}h2{font-size:1.1em;margin-top:1.6em}
table{border-collapse:collapse;width:100%}td,th{border-bottom:1px solid #ddd;padding:.25em .5em;text-align:left;
vertical-align:top}th{background:#f4f4f4}dl{display:grid;grid-template-columns:max-content auto;gap:.2em 1em}
dt{color:#555}dd{margin:0;font-weight:600}.refused{color:#a00}.promoted{color:#070}.rollback,.reset{color:#850}
.muted{color:#777}svg text{font:12px system-ui,sans-serif}td[data-field=time],td[data-field=last_seen]{white-space:nowrap}
"""


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _time(ts: Any) -> str:
    if not isinstance(ts, (int, float)):
        return ""
    return datetime.datetime.fromtimestamp(ts, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _num(value: Any, digits: int = 4) -> str:
    if isinstance(value, bool) or value is None:
        return "" if value is None else str(value)
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def _rate(rate: float | None) -> str:
    return "n/a" if rate is None else f"{rate * 100:.0f}%"


def _page(title: str, body: str) -> str:
    return (f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{_e(title)}</title>"
            f"<meta name=\"viewport\" content=\"width=device-width\"><style>{_STYLE}</style></head>"
            f"<body>{body}</body></html>")


def login_page(message: str = "") -> str:
    """The key form (POST /login); ``message`` says why it is shown again."""
    note = f"<p class=\"refused\" id=\"login-error\">{_e(message)}</p>" if message else ""
    return _page("openclaw_jax: sign in", (
        "<h1>openclaw_jax status</h1><p>Enter the gateway's API key to see what your agent learned.</p>"
        f"{note}<form method=\"post\" action=\"/login\"><input type=\"password\" name=\"key\" id=\"key\" "
        "autocomplete=\"current-password\" required> <button type=\"submit\" id=\"sign-in\">Sign in</button></form>"))


PLOT_VERSIONS = 40   # the plot shows the most recent versions (the JSON has them all)


def satisfaction_svg(rows: Sequence[dict[str, Any]], served: str | None, width: int = 640, height: int = 220) -> str:
    """Bars of the satisfaction rate (satisfied / (satisfied + corrected)) per weight version, in order
    (the last `PLOT_VERSIONS`)."""
    rows = list(rows)[-PLOT_VERSIONS:]
    left, bottom, top = 40, 40, 10
    plot_h = height - bottom - top
    n = max(len(rows), 1)
    slot = (width - left - 10) / n
    bar_w = max(min(slot * 0.7, 60), 4)
    parts = [f"<svg id=\"satisfaction\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" "
             f"viewBox=\"0 0 {width} {height}\" role=\"img\" aria-label=\"satisfaction rate per served version\">"]
    for frac in (0.0, 0.5, 1.0):
        y = top + plot_h * (1 - frac)
        parts.append(f"<line x1=\"{left}\" x2=\"{width - 10}\" y1=\"{y:.1f}\" y2=\"{y:.1f}\" stroke=\"#ddd\"/>"
                     f"<text x=\"{left - 6}\" y=\"{y + 4:.1f}\" text-anchor=\"end\">{int(frac * 100)}%</text>")
    for i, row in enumerate(rows):
        rate = row["rate"]
        x = left + i * slot + (slot - bar_w) / 2
        h = plot_h * (rate or 0.0)
        fill = "#2a7" if str(row["version"]) == str(served) else "#69c"
        label = _rate(rate)
        parts.append(
            f"<g class=\"bar\" data-version=\"{_e(row['version'])}\" data-rate=\"{'' if rate is None else repr(rate)}\" "
            f"data-satisfied=\"{row['satisfied']}\" data-corrected=\"{row['corrected']}\">"
            f"<title>version {_e(row['version'])}: {row['satisfied']} satisfied, {row['corrected']} corrected</title>"
            f"<rect x=\"{x:.1f}\" y=\"{top + plot_h - h:.1f}\" width=\"{bar_w:.1f}\" height=\"{h:.1f}\" fill=\"{fill}\"/>"
            f"<text x=\"{x + bar_w / 2:.1f}\" y=\"{top + plot_h - h - 3:.1f}\" text-anchor=\"middle\">{label}</text>"
            f"<text x=\"{x + bar_w / 2:.1f}\" y=\"{height - bottom + 15:.1f}\" text-anchor=\"middle\">"
            f"v{_e(row['version'])}</text>"
            f"<text x=\"{x + bar_w / 2:.1f}\" y=\"{height - bottom + 30:.1f}\" text-anchor=\"middle\" class=\"muted\">"
            f"{row['satisfied']}/{row['satisfied'] + row['corrected']}</text></g>")
    parts.append("</svg>")
    return "".join(parts)


def _table(table_id: str, headers: Sequence[str], rows: Sequence[str], empty: str) -> str:
    if not rows:
        return f"<p class=\"muted\" id=\"{table_id}-empty\">{_e(empty)}</p>"
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    return f"<table id=\"{table_id}\"><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def _cell(field: str, value: Any, text: str | None = None, cls: str = "") -> str:
    klass = f" class=\"{cls}\"" if cls else ""
    return f"<td data-field=\"{field}\"{klass}>{_e(value) if text is None else text}</td>"


def _summary(status: dict[str, Any]) -> str:
    trainer, store = status["trainer"], status["store"]
    gate = {True: "on", False: "off", None: "unknown (no versions log yet)"}[trainer["gate"]]
    items = [("served-version", "Served version", status["served_version"] or "unknown"),
             ("gate", "Promotion gate", gate), ("trainer-step", "Last trained step", _num(trainer["last_step"])),
             ("candidates", "Versions checked", trainer["candidates"]), ("promoted", "Promoted", trainer["promoted"]),
             ("refused", "Refused", trainer["refused"]), ("rollbacks", "Rollbacks", trainer["rollbacks"]),
             ("store-samples", "Scored turns stored", store["samples"]),
             ("store-held-out", "Held out for the gate", store["held_out"]),
             ("store-bytes", "Store size (bytes)", store["bytes"]),
             ("requests-main", "Main requests", status["requests"]["main"]),
             ("requests-side", "Side requests", status["requests"]["side"])]
    rows = "".join(f"<dt>{_e(label)}</dt><dd id=\"{key}\">{_e(value)}</dd>" for key, label, value in items)
    return f"<dl id=\"summary\">{rows}</dl>"


def _versions(events: Sequence[dict[str, Any]]) -> str:
    rows = []
    for ev in events:
        check = ev.get("check") or {}
        rows.append(
            f"<tr class=\"event {_e(ev['event'])}\" data-version=\"{_e(ev['version'])}\">"
            + _cell("time", _time(ev.get("time"))) + _cell("event", ev["event"], cls=_e(ev["event"]))
            + _cell("version", ev["version"]) + _cell("served", ev.get("served_version"))
            + _cell("score", _num(check.get("score"))) + _cell("drift", _num(check.get("drift")))
            + _cell("replayed", _num(check.get("with_signal"))) + _cell("reason", ev.get("reason", "")) + "</tr>")
    return _table("versions", ["time", "event", "version", "served after", "score", "drift", "turns replayed",
                               "why"], rows, "No weight version recorded yet.")


def _people(people: Sequence[dict[str, Any]]) -> str:
    rows = []
    for p in people:
        versions = ", ".join(f"v{v['version']}: {_rate(v['rate'])} ({v['satisfied']}/{v['satisfied'] + v['corrected']})"
                             for v in p["satisfaction"])
        rows.append(
            f"<tr class=\"person\" data-person=\"{_e(p['person'])}\" "
            f"data-rate=\"{'' if p['rate'] is None else repr(p['rate'])}\">"
            + _cell("person", p["person"]) + _cell("sessions", p["sessions"]) + _cell("open", p["open_sessions"])
            + _cell("main", p["main_requests"]) + _cell("side", p["side_requests"])
            + _cell("scored", p["scored_turns"]) + _cell("satisfied", p["satisfied"])
            + _cell("corrected", p["corrected"]) + _cell("hint_only", p["hint_only"])
            + _cell("rate", _rate(p["rate"])) + _cell("by_version", versions)
            + _cell("last_seen", _time(p["last_request"])) + "</tr>")
    return _table("people", ["person", "sessions", "open", "main requests", "side requests", "scored turns",
                             "satisfied", "corrected", "hint only", "satisfaction", "per version", "last request"],
                  rows, "Nobody yet.")


def _turns(turns: Sequence[dict[str, Any]]) -> str:
    rows = []
    for t in turns:
        rows.append(
            f"<tr class=\"turn\" data-offset=\"{t['offset']}\">" + _cell("time", _time(t.get("time")))
            + _cell("person", t["person"]) + _cell("session", t["session_id"]) + _cell("turn", t["turn_index"])
            + _cell("version", t["weight_version"]) + _cell("reward", _num(t["reward"]))
            + _cell("eval", t["eval_score"]) + _cell("reaction", t["reaction"]) + _cell("hint", t["hint"])
            + _cell("held_out", "yes" if t["held_out"] else "") + "</tr>")
    return _table("scored-turns", ["time", "person", "session", "turn", "version", "reward", "judge", "your reaction",
                                   "hint", "held out"], rows, "No scored turn yet.")


def _sessions(sessions: Sequence[dict[str, Any]]) -> str:
    rows = ["<tr class=\"session\">" + _cell("person", s["person"]) + _cell("session", s["session_id"])
            + _cell("main", s["main_turns"])
            + _cell("side", s["side_turns"]) + _cell("last_seen", _time(s["last_seen"]))
            + _cell("open", "yes" if s["open"] else "") + "</tr>" for s in sessions]
    return _table("sessions", ["person", "session", "main turns", "side turns", "last request", "open"], rows,
                  "No session since the gateway started.")


def status_page(status: dict[str, Any]) -> str:
    """The whole page for a ``/v1/status`` body."""
    body = (f"<h1>What your agent learned <span class=\"muted\">({_e(status['model'])})</span></h1>"
            f"<p class=\"muted\">As of {_e(_time(status['time']))}. Reload for newer numbers.</p>"
            + _summary(status)
            + "<h2>Satisfaction per served version</h2><p class=\"muted\">Scored turns the judge read as satisfied "
              "(+1), over those it read as satisfied or corrected (-1), by the weight version that answered.</p>"
            + satisfaction_svg(status["satisfaction"], status["served_version"])
            + "<h2>People</h2><p class=\"muted\">Each person's sessions and requests since the gateway started, "
              "their sessions open now, and their scored turns in the store: satisfied (+1), corrected (-1), hint "
              "only, and the satisfaction rate, overall and per weight version.</p>" + _people(status["people"])
            + "<h2>Weight versions and the gate's decisions</h2>" + _versions(status["versions"])
            + "<h2>Scored turns</h2>" + _turns(status["scored_turns"])
            + "<h2>Sessions</h2>" + _sessions(status["sessions"]))
    return _page("openclaw_jax status", body)
