#!/usr/bin/env python3
"""retie's demo lab target: a small web app that is vulnerable ON PURPOSE.

Five flaws, each with the fix a real patch would make (--fixed):
  1. /login     SQL injection by string concatenation  -> parameterized query
  2. /download  path traversal                         -> canonicalize, stay under files/
  3. /record    IDOR (any record by id)                -> ownership check (/export too)
  4. /search    reflected XSS                          -> HTML escaping, quotes included
  5. /diag      command injection via a shell          -> argument list, no shell

and a third build (--partial) with the fix a hurried patch makes: each
finding's original payload fails and a variant still works (the gaps are
described for people in lab/findings/README.md).

Run it only inside a retie lab (`retie lab up --demo [--fixed]`): the lab
has no route out, and the app runs in a sandbox of its own.
"""
import argparse
import hashlib
import html
import http.cookies
import os
import secrets
import sqlite3
import subprocess
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ARGS = None
FILES = None
SESSIONS = {}  # token -> user id


def pw_hash(pw):
    return hashlib.sha256(pw.encode()).hexdigest()


def db():
    return sqlite3.connect(os.path.join(ARGS.data, "demo.db"))


def init_data():
    global FILES
    FILES = os.path.join(ARGS.data, "files")
    os.makedirs(FILES, exist_ok=True)
    for name, text in [("notes.txt", "meeting at 10\nbring coffee\n"),
                       ("report.txt", "q3 numbers\nall green\nship it\n")]:
        with open(os.path.join(FILES, name), "w") as f:
            f.write(text)
    with db() as c:
        c.executescript("""
            DROP TABLE IF EXISTS users; DROP TABLE IF EXISTS records;
            CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT UNIQUE, pw TEXT);
            CREATE TABLE records (id INTEGER PRIMARY KEY, owner INTEGER, body TEXT);
        """)
        c.executemany("INSERT INTO users VALUES (?, ?, ?)",
                      [(1, "admin", pw_hash(secrets.token_hex(16))),
                       (2, "alice", pw_hash("alice-pw"))])
        c.executemany("INSERT INTO records VALUES (?, ?, ?)",
                      [(1, 1, "admin salary: FLAG-IDOR-7731"),
                       (2, 2, "alice's shopping list")])


PAGE = """<!doctype html><title>retie demo</title><h1>retie demo lab ({mode})</h1>
<form method=post action=/login>user <input name=user> password <input name=password
type=password><button>log in</button></form>
<form action=/search>search <input name=q><button>go</button></form>
<p><a href=/download?file=notes.txt>notes.txt</a> ·
<a href=/diag?file=report.txt>line count of report.txt</a> ·
<a href=/record?id=2>my record</a> ·
<a href=/export?id=2>export my record</a></p>"""


class Handler(BaseHTTPRequestHandler):
    server_version = "retie-demo/1"

    def log_message(self, fmt, *args):
        pass

    def send(self, code, body, ctype="text/html; charset=utf-8", headers=()):
        data = body.encode() if isinstance(body, str) else body
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        for k, v in headers:
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def user(self):
        cookie = http.cookies.SimpleCookie(self.headers.get("Cookie", ""))
        tok = cookie.get("session")
        return SESSIONS.get(tok.value) if tok else None

    def do_GET(self):
        url = urllib.parse.urlsplit(self.path)
        q = {k: v[0] for k, v in urllib.parse.parse_qs(url.query).items()}
        route = {"/": self.index, "/download": self.download, "/record": self.record,
                 "/export": self.export, "/search": self.search,
                 "/diag": self.diag}.get(url.path)
        if route is None:
            return self.send(404, "not found\n", "text/plain")
        route(q)

    def do_POST(self):
        if self.path != "/login":
            return self.send(404, "not found\n", "text/plain")
        n = int(self.headers.get("Content-Length", "0"))
        form = {k: v[0] for k, v in urllib.parse.parse_qs(self.rfile.read(n).decode()).items()}
        self.login(form.get("user", ""), form.get("password", ""))

    def index(self, q):
        mode = "fixed" if ARGS.fixed else "partially fixed" if ARGS.partial else "VULNERABLE"
        self.send(200, PAGE.format(mode=mode))

    # 1. SQL injection
    def login(self, user, password):
        with db() as c:
            if ARGS.fixed:
                row = c.execute("SELECT id, name FROM users WHERE name = ? AND pw = ?",
                                (user, pw_hash(password))).fetchone()
            else:
                # --partial: a case-sensitive keyword block list.
                if ARGS.partial and any(k in user for k in ("OR", "AND", "UNION", "SELECT")):
                    return self.send(403, "login failed\n", "text/plain")
                sql = ("SELECT id, name FROM users WHERE name = '" + user +
                       "' AND pw = '" + pw_hash(password) + "'")
                try:
                    row = c.execute(sql).fetchone()
                except sqlite3.Error as e:
                    return self.send(500, "database error: %s\n" % e, "text/plain")
        if row is None:
            return self.send(403, "login failed\n", "text/plain")
        tok = secrets.token_hex(16)
        SESSIONS[tok] = row[0]
        self.send(200, "Welcome %s\n" % row[1], "text/plain",
                  [("Set-Cookie", "session=%s; HttpOnly" % tok)])

    # 2. Path traversal
    def download(self, q):
        name = q.get("file", "")
        if ARGS.partial:
            name = name.replace("../", "")  # one pass: "....//" becomes "../"
        path = os.path.join(FILES, name)
        if ARGS.fixed:
            path = os.path.realpath(path)
            if not path.startswith(os.path.realpath(FILES) + os.sep):
                return self.send(403, "forbidden\n", "text/plain")
        try:
            with open(path, "rb") as f:
                return self.send(200, f.read(), "application/octet-stream")
        except OSError:
            return self.send(404, "no such file\n", "text/plain")

    # 3. IDOR: /record and /export serve the same records.
    def record(self, q):
        self.serve_record(q, checked=ARGS.fixed or ARGS.partial)

    def export(self, q):
        # --partial: the ownership check went into /record only.
        self.serve_record(q, checked=ARGS.fixed)

    def serve_record(self, q, checked):
        uid = self.user()
        if uid is None:
            return self.send(401, "log in first\n", "text/plain")
        with db() as c:
            row = c.execute("SELECT owner, body FROM records WHERE id = ?",
                            (q.get("id", ""),)).fetchone()
        if row is None:
            return self.send(404, "no such record\n", "text/plain")
        if checked and row[0] != uid:
            return self.send(403, "not your record\n", "text/plain")
        self.send(200, row[1] + "\n", "text/plain")

    # 4. Reflected XSS
    def search(self, q):
        term = q.get("q", "")
        if ARGS.fixed:
            shown = html.escape(term)
        elif ARGS.partial:
            # Escapes < > & for the text, but not the quotes the
            # attribute below needs.
            shown = html.escape(term, quote=False)
        else:
            shown = term
        self.send(200, "<!doctype html><form action=/search><input name=q value=\"%s\">"
                       "<button>again</button></form><p>No results for %s</p>\n" % (shown, shown))

    # 5. Command injection
    def diag(self, q):
        name = q.get("file", "")
        if ARGS.fixed:
            path = os.path.realpath(os.path.join(FILES, name))
            if not path.startswith(os.path.realpath(FILES) + os.sep) or not os.path.isfile(path):
                return self.send(404, "no such file\n", "text/plain")
            out = subprocess.run(["wc", "-l", "--", path], capture_output=True, text=True)
        else:
            # --partial: a block list of shell separators, missing $( ),
            # backticks and newlines.
            if ARGS.partial and any(c in name for c in ";&|<>"):
                return self.send(400, "invalid file name\n", "text/plain")
            out = subprocess.run("wc -l " + FILES + "/" + name, shell=True,
                                 capture_output=True, text=True)
        self.send(200, out.stdout + out.stderr, "text/plain")


def main():
    global ARGS
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--data", default=".")
    build = p.add_mutually_exclusive_group()
    build.add_argument("--fixed", action="store_true")
    build.add_argument("--partial", action="store_true")
    ARGS = p.parse_args()
    init_data()
    ThreadingHTTPServer(("0.0.0.0", ARGS.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
