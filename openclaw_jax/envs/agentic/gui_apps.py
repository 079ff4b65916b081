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


class _App:
    """The Tk application: widgets from the spec, and its state as JSON on request over stdin/stdout."""

    def __init__(self, tk, spec: dict):
        self.tk = tk
        self.root = tk.Tk()
        self.root.title(spec.get("title", "app"))
        self.root.geometry(f"{spec['width']}x{spec['height']}+0+0")
        self.root.configure(background="#e8e8e8")
        self.font = ("DejaVu Sans", 10)
        self.state = {"entries": {}, "pressed": [], "menu": None, "menu_of": None, "focus": None}
        self.widgets, self.entries, self.menus = {}, {}, {}
        self.buf = bytearray()
        for w in spec["widgets"]:
            widget = self._make_widget(w)
            widget.place(x=w["x"], y=w["y"], width=w["w"], height=w["h"])
            self.widgets[w["name"]] = widget

    def press(self, name):  # each press with the entries' values at that moment
        self.state["pressed"].append({"name": name, "entries": {n: v.get() for n, v in self.entries.items()}})

    def choose(self, name, item, var):
        self.state["menu"], self.state["menu_of"] = item, name
        var.set(item)

    def _make_widget(self, w):
        tk, root, font, kind, name = self.tk, self.root, self.font, w["kind"], w["name"]
        if kind == "label":
            return tk.Label(root, text=w.get("text", ""), font=font, anchor="w", background="#e8e8e8")
        if kind == "entry":
            var = tk.StringVar(value=w.get("value", ""))
            widget = tk.Entry(root, textvariable=var, font=font)
            if w.get("readonly"):
                widget.configure(state="readonly")
            self.entries[name] = var
            return widget
        if kind == "button":
            return tk.Button(root, text=w.get("text", name), font=font, command=lambda n=name: self.press(n))
        if kind == "menu":
            var = tk.StringVar(value=w.get("text", name))
            widget = tk.Menubutton(root, textvariable=var, font=font, relief="raised", indicatoron=True)
            menu = tk.Menu(widget, tearoff=0, font=font)
            for item in w.get("items", []):
                menu.add_command(label=item, command=lambda n=name, i=item, v=var: self.choose(n, i, v))
            widget.configure(menu=menu)
            self.menus[name] = menu
            return widget
        raise ValueError(f"unknown widget kind {kind!r}")

    def geometry(self):
        return {name: [w.winfo_rootx(), w.winfo_rooty(), w.winfo_width(), w.winfo_height()]
                for name, w in self.widgets.items()}

    def posted_menu(self):
        for name, menu in self.menus.items():
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

    def snapshot(self):
        self.root.update()
        for name, var in self.entries.items():
            self.state["entries"][name] = var.get()
        focus = self.root.focus_get()
        self.state["focus"] = next((n for n, w in self.widgets.items() if w is focus), None)
        return {"state": self.state, "geometry": self.geometry(), "menu": self.posted_menu()}

    def on_stdin(self, *_):
        chunk = os.read(0, 65536)
        if not chunk:  # the host went away
            self.root.destroy()
            return
        self.buf.extend(chunk)
        while b"\n" in self.buf:
            line, _, rest = bytes(self.buf).partition(b"\n")
            self.buf[:] = rest
            cmd = json.loads(line or b"{}").get("cmd")
            if cmd == "quit":
                self.reply({"bye": True})
                self.root.destroy()
                return
            self.reply(self.snapshot() if cmd == "state" else {"error": f"unknown command {cmd!r}"})

    @staticmethod
    def reply(obj):
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()

    def run(self):
        self.root.tk.createfilehandler(0, self.tk.READABLE, self.on_stdin)
        self.root.update()
        self.reply({"ready": True, **self.snapshot()})
        self.root.mainloop()


def main():
    _connect_display()
    import tkinter as tk  # inside the jail, after the display is connected; the host never imports Tk

    spec_path = sys.argv[1] if len(sys.argv) > 1 else "/sandbox/app.json"
    with open(spec_path) as f:
        spec = json.load(f)
    _App(tk, spec).run()


if __name__ == "__main__":
    main()
