"""The console's side of the multi-process suite: a process that keeps the store open and
writes through :class:`~keyturn.KeyManager`, as a console process does.

``python -m tests.multiprocess.writer STORE_URL`` reads one JSON command per line on
standard input and answers each with one JSON line, printed after the write has returned
(committed):

- ``{"op": "create", "account": A, "name": N}`` (a tenant key in ``acme``), or with
  ``"organization": O`` (a key scoped to O); answers ``{"key_id": ..., "secret": ...}``;
- ``{"op": "rotate", "account": A, "key_id": K}``: answers the replacement, as create;
- ``{"op": "revoke", "account": A, "key_id": K}``: answers ``{"status": "Revoked"}``.

A command that raises answers ``{"error": "<type>: <message>"}``. It stops at the end of
its input.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from keyturn import CreatedKey, KeyManager, Scope
from keyturn.stores import open_database


def answer(manager: KeyManager, command: dict[str, Any]) -> dict[str, str]:
    account = command["account"]
    created: CreatedKey
    if command["op"] == "create":
        organization = command.get("organization")
        scope = Scope.tenant("acme") if organization is None else None
        created = manager.create(
            account, name=command["name"], scope=scope, organization=organization
        )
    elif command["op"] == "rotate":
        created = manager.rotate(account, command["key_id"])
    else:
        return {"status": manager.revoke(account, command["key_id"]).status.value}
    return {"key_id": created.info.key_id, "secret": created.secret}


def main(url: str) -> None:
    with open_database(url) as db:
        manager = KeyManager(db.keys, db.membership)
        for line in sys.stdin:
            try:
                reply = answer(manager, json.loads(line))
            except Exception as exc:  # reported to the test, which fails on it
                reply = {"error": f"{type(exc).__name__}: {exc}"}
            print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
