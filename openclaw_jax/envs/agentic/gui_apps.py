"""The GUI environment's application: a small real Tk program that `gui.py` runs inside the sandbox.

Stdlib only (it runs as `python -I -B -c <this file>` in the jail, with /sandbox as its directory).
It reads its task from /sandbox/app.json:

    {"width": W, "height": H, "title": str, "widgets": [
        {"name": str, "kind": "label" | "entry" | "button" | "menu", "x": int, "y": int, "w": int, "h": int,
         "text": str, "value": str, "readonly": bool, "items": [str, ...]}, ...]}

Widgets are placed at exactly those pixels (`place`), so a layout is a property of the task; the
application still reports where each widget really is (`geometry`), and the tests act from that.

Control channel (the agent only has the X display; it never sees these pipes): one JSON command per
line on stdin, one JSON reply per line on stdout.
  {"cmd": "state"}  -> processes every pending X event first (Tk `update`, which round-trips to the
                       server), then {"state": {...}, "geometry": {...}, "menu": {...} | null}
  {"cmd": "quit"}   -> {"bye": true} and exits.
State: entry values, button presses in order (each with the entry values at that moment), the chosen
menu item and its menu, and which widget has focus.
"""

import json
import os
import sys


def _connect_display():
    """Inside the jail /tmp is private: link the X socket the host put in /sandbox to where Xlib looks."""
    sock = "/sandbox/.X11-socket"
    if os.path.exists(sock):
        os.makedirs("/tmp/.X11-unix", exist_ok=True)
        if not os.path.lexists("/tmp/.X11-unix/X0"):
            os.symlink(sock, "/tmp/.X11-unix/X0")
        os.environ["DISPLAY"] = ":0"
    if os.path.exists("/sandbox/fonts.conf"):  # the jail has no /etc/fonts
        os.environ["FONTCONFIG_FILE"] = "/sandbox/fonts.conf"


def main():
    _connect_display()
    import tkinter as tk

    spec_path = sys.argv[1] if len(sys.argv) > 1 else "/sandbox/app.json"
    with open(spec_path) as f:
        spec = json.load(f)
    root = tk.Tk()
    root.title(spec.get("title", "app"))
    root.geometry(f"{spec['width']}x{spec['height']}+0+0")
    root.configure(background="#e8e8e8")
    font = ("DejaVu Sans", 10)
    state = {"entries": {}, "pressed": [], "menu": None, "menu_of": None, "focus": None}
    widgets, entries, menus = {}, {}, {}

    def press(name):  # each press with the entries' values at that moment
        state["pressed"].append({"name": name, "entries": {n: v.get() for n, v in entries.items()}})

    def choose(name, item, var):
        state["menu"], state["menu_of"] = item, name
        var.set(item)

    for w in spec["widgets"]:
        kind, name = w["kind"], w["name"]
        if kind == "label":
            widget = tk.Label(root, text=w.get("text", ""), font=font, anchor="w", background="#e8e8e8")
        elif kind == "entry":
            var = tk.StringVar(value=w.get("value", ""))
            widget = tk.Entry(root, textvariable=var, font=font)
            if w.get("readonly"):
                widget.configure(state="readonly")
            entries[name] = var
        elif kind == "button":
            widget = tk.Button(root, text=w.get("text", name), font=font, command=lambda n=name: press(n))
        elif kind == "menu":
            var = tk.StringVar(value=w.get("text", name))
            widget = tk.Menubutton(root, textvariable=var, font=font, relief="raised", indicatoron=True)
            menu = tk.Menu(widget, tearoff=0, font=font)
            for item in w.get("items", []):
                menu.add_command(label=item, command=lambda n=name, i=item, v=var: choose(n, i, v))
            widget.configure(menu=menu)
            menus[name] = menu
        else:
            raise ValueError(f"unknown widget kind {kind!r}")
        widget.place(x=w["x"], y=w["y"], width=w["w"], height=w["h"])
        widgets[name] = widget

    def geometry():
        out = {}
        for name, widget in widgets.items():
            out[name] = [widget.winfo_rootx(), widget.winfo_rooty(), widget.winfo_width(), widget.winfo_height()]
        return out

    def posted_menu():
        for name, menu in menus.items():
            if menu.winfo_ismapped():
                n = menu.index("end")
                items = []
                for i in range(0 if n is None else n + 1):
                    top = menu.yposition(i)
                    bottom = menu.yposition(i + 1) if i < n else menu.winfo_height()
                    items.append([menu.entrycget(i, "label"), menu.winfo_rootx(), menu.winfo_rooty() + top,
                                  menu.winfo_width(), bottom - top])
                return {"name": name, "items": items, "active": menu.index("active")}
        return None

    def snapshot():
        root.update()
        for name, var in entries.items():
            state["entries"][name] = var.get()
        focus = root.focus_get()
        state["focus"] = next((n for n, w in widgets.items() if w is focus), None)
        return {"state": state, "geometry": geometry(), "menu": posted_menu()}

    buf = bytearray()

    def on_stdin(*_):
        chunk = os.read(0, 65536)
        if not chunk:  # the host went away
            root.destroy()
            return
        buf.extend(chunk)
        while b"\n" in buf:
            line, _, rest = bytes(buf).partition(b"\n")
            buf[:] = rest
            cmd = json.loads(line or b"{}").get("cmd")
            if cmd == "quit":
                reply({"bye": True})
                root.destroy()
                return
            reply(snapshot() if cmd == "state" else {"error": f"unknown command {cmd!r}"})

    def reply(obj):
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()

    root.tk.createfilehandler(0, tk.READABLE, on_stdin)
    root.update()
    reply({"ready": True, **snapshot()})
    root.mainloop()


if __name__ == "__main__":
    main()
