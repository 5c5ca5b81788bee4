"""`keyturn scan`: real keys are found by place, id and hint; look-alikes and secrets are not."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from keyturn._core import token as _token
from keyturn.cli import main
from keyturn.scan import (
    CHUNK_BYTES,
    _find,
    find_added_keys,
    find_keys,
    find_staged_keys,
    scan_paths,
)

# Text that cannot extend a key: no letters, digits or underscores.
glue = st.text(alphabet=st.sampled_from(" \t\n\"'=:,;()[]{}<>/\\.-+é🔑"), max_size=20)


@given(before=glue, after=glue)
def test_a_key_anywhere_in_text_is_found_once_with_its_place(before: str, after: str) -> None:
    """A key embedded in any surrounding punctuation is found, at its line and column."""
    token = _token.generate()
    text = before + token.token + after
    (finding,) = find_keys(text, "f.py")
    assert (finding.key_id, finding.hint) == (token.key_id, token.hint)
    assert finding.line == before.count("\n") + 1
    assert finding.column == len(before) - (before.rfind("\n") + 1) + 1


@given(st.text())
def test_random_text_holds_no_key(text: str) -> None:
    """Text without a checksummed key yields nothing (a random match is 1 in 5.7e10)."""
    assert list(find_keys(text)) == []


@pytest.mark.parametrize(
    "variant",
    [
        lambda t: t[:-1] + ("a" if t[-1] != "a" else "b"),  # checksum broken
        lambda t: "x" + t,  # glued to a longer word
        lambda t: t + "Z",  # one character too long
        lambda t: "rma_" + "x" * 46,  # a placeholder in docs
    ],
    ids=["bad checksum", "glued before", "glued after", "placeholder"],
)
def test_look_alikes_are_not_reported(variant: object) -> None:
    """Only well-formed keys count: typos, longer tokens and placeholders are ignored."""
    token = _token.generate().token
    assert list(find_keys(variant(token))) == []  # type: ignore[operator]


def test_scan_walks_folders_and_skips_tool_state_and_binaries(tmp_path: Path) -> None:
    """Keys in source files are found; .git, virtual environments and binary files are skipped."""
    token = _token.generate()
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "settings.py").write_text(f'API_KEY = "{token.token}"\n')
    for skipped in (".git", ".venv", "node_modules"):
        (tmp_path / skipped).mkdir()
        (tmp_path / skipped / "leak.txt").write_text(token.token)
    (tmp_path / "blob.bin").write_bytes(b"\0\1" + token.token.encode())
    findings = list(scan_paths([tmp_path]))
    assert [(Path(f.source).name, f.line, f.column) for f in findings] == [("settings.py", 1, 12)]


def test_cli_reports_hints_never_secrets_and_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`keyturn scan` prints place, id and hint, exits 1, and never prints the secret."""
    token = _token.generate()
    (tmp_path / "notes.md").write_text(
        f"try it:\n  curl -H 'Authorization: Bearer {token.token}'\n"
    )
    assert main(["scan", str(tmp_path)]) == 1
    out, err = capsys.readouterr()
    assert f"notes.md:2:34: {token.hint} (key id {token.key_id})" in out
    assert "revoke them" in err
    assert token.secret not in out + err


def test_cli_exits_0_on_a_clean_tree_and_reads_stdin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A tree without keys exits 0; '-' scans standard input, as in a pre-commit hook."""
    (tmp_path / "clean.py").write_text("KEY = 'rma_...'  # placeholder\n")
    assert main(["scan", str(tmp_path)]) == 0
    monkeypatch.setattr("sys.stdin", io.StringIO("+ key = " + _token.generate().token))
    assert main(["scan", "-"]) == 1
    assert "<stdin>:1:9:" in capsys.readouterr().out


def test_this_repository_holds_no_key() -> None:
    """No key is committed anywhere in the project's own tree."""
    root = Path(__file__).resolve().parents[2]
    assert [str(f) for f in scan_paths([root])] == []


class CountingText(str):
    """Text that counts the characters its newline searches look at."""

    examined = 0

    def count(self, sub: str, start: int | None = 0, end: int | None = None) -> int:  # type: ignore[override]
        CountingText.examined += (len(self) if end is None else end) - (start or 0)
        return super().count(sub, start, end)

    def rfind(self, sub: str, start: int | None = 0, end: int | None = None) -> int:  # type: ignore[override]
        CountingText.examined += (len(self) if end is None else end) - (start or 0)
        return super().rfind(sub, start, end)


def test_placing_keys_is_linear_in_the_text() -> None:
    """Newline searches look at each character about once, however many keys there are."""
    keys = [_token.generate() for _ in range(2000)]
    text = CountingText("".join(f"line {i}: {key.token}\n" for i, key in enumerate(keys)))
    CountingText.examined = 0
    findings = list(find_keys(text))
    assert [(f.key_id, f.line, f.column) for f in findings] == [
        (key.key_id, i + 1, len(f"line {i}: ") + 1) for i, key in enumerate(keys)
    ]
    assert CountingText.examined <= 2 * len(text)  # quadratic: about 1000 times the text


# `keyturn scan` in a child process that can neither hang the suite nor eat the machine's memory.
IN_A_CHILD = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
from keyturn.cli import main
sys.exit(main(["scan", *sys.argv[1:]]))
"""


def _scan_in_a_child(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(  # noqa: S603 -- our own interpreter and arguments
        [sys.executable, "-c", IN_A_CHILD, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="needs /dev/zero and named pipes")
def test_devices_and_pipes_are_skipped_not_read(tmp_path: Path) -> None:
    """A symlink to /dev/zero and a named pipe are skipped: the scan ends and finds the real key."""
    token = _token.generate()
    (tmp_path / "zero").symlink_to("/dev/zero")
    os.mkfifo(tmp_path / "pipe")
    (tmp_path / "settings.py").write_text(f"KEY = '{token.token}'\n")
    done = _scan_in_a_child(str(tmp_path))
    assert done.returncode == 1, done.stderr
    assert done.stdout == f"{tmp_path / 'settings.py'}:1:8: {token.hint} (key id {token.key_id})\n"


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-16-be", "utf-8-sig"])
def test_utf16_files_are_scanned(tmp_path: Path, encoding: str) -> None:
    """Keys in UTF-16 files, with or without a byte order mark, are found at their place."""
    token = _token.generate()
    (tmp_path / "notes.txt").write_bytes(f"héllo\n  key: {token.token}\n".encode(encoding))
    (finding,) = scan_paths([tmp_path])
    assert (finding.key_id, finding.line, finding.column) == (token.key_id, 2, 8)


def test_file_names_are_printed_escaped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Terminal escapes and newlines in a file name are printed as \\x.. and cannot hide it."""
    token = _token.generate()
    (tmp_path / "a\x1b[2K\rclean\n.py").write_text(token.token)
    assert main(["scan", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\r" not in out and out.count("\n") == 1
    assert "a\\x1b[2K\\rclean\\n.py:1:1:" in out


def test_a_path_that_does_not_exist_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A mistyped path exits 2 and names it, rather than reporting a clean tree."""
    assert main(["scan", str(tmp_path), str(tmp_path / "nope")]) == 2
    assert f"no such file or directory: {tmp_path / 'nope'}" in capsys.readouterr().err
    with pytest.raises(FileNotFoundError):
        list(scan_paths([tmp_path / "nope"]))


def test_a_diff_counts_only_added_lines_at_their_new_place() -> None:
    """Removed and context lines are ignored; an added key is placed in the new file."""
    removed, kept, added = (_token.generate() for _ in range(3))
    diff = (
        "diff --git a/old.env b/old.env\n"
        "--- a/old.env\n"
        "+++ b/old.env\n"
        "@@ -1,3 +1,2 @@\n"
        f"-KEY={removed.token}\n"
        f" OTHER={kept.token}\n"
        "+++ looks like a header, is an added line\n"
        f"-X={removed.token}\n"
        "diff --git a/new.py b/new.py\n"
        "--- /dev/null\n"
        '+++ "b/caf\\303\\251.py"\n'
        "@@ -0,0 +10 @@\n"
        f"+    key = '{added.token}'\n"
        "\\ No newline at end of file\n"
    )
    findings = list(find_added_keys(diff))
    assert [(f.source, f.line, f.column, f.key_id) for f in findings] == [
        ("café.py", 10, 12, added.key_id)
    ]


def git(repo: Path, *args: str) -> None:
    subprocess.run(  # noqa: S603 -- fixed arguments in a scratch repository
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args],  # noqa: S607
        cwd=repo,
        check=True,
        capture_output=True,
    )


def test_staged_blocks_adding_a_key_but_not_removing_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`scan --staged` passes the commit that removes a leaked key and stops one adding a key."""
    token = _token.generate()
    git(tmp_path, "init", "-q")
    (tmp_path / "settings.py").write_text(f"DEBUG = True\nKEY = '{token.token}'\n")
    git(tmp_path, "add", "settings.py")
    git(tmp_path, "commit", "-q", "-m", "leak")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "settings.py").write_text("DEBUG = True\nKEY = os.environ['KEY']\n")
    git(tmp_path, "add", "settings.py")
    assert main(["scan", "--staged"]) == 0
    (tmp_path / "deploy.sh").write_text(f"#!/bin/sh\n\nexport KEY={token.token}\n")
    git(tmp_path, "add", "deploy.sh")
    capsys.readouterr()
    assert main(["scan", "--staged"]) == 1
    assert capsys.readouterr().out == f"deploy.sh:3:12: {token.hint} (key id {token.key_id})\n"


def test_staged_outside_a_repository_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """--staged outside a git repository exits 2 with git's reason, not 0."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    assert main(["scan", "--staged"]) == 2
    assert "git diff --cached failed" in capsys.readouterr().err


def test_the_pre_commit_hook_runs_the_staged_scan() -> None:
    """.pre-commit-hooks.yaml offers a hook whose entry is `keyturn scan --staged`."""
    hooks = (Path(__file__).resolve().parents[2] / ".pre-commit-hooks.yaml").read_text()
    assert "- id: keyturn-scan\n" in hooks
    assert "\n  entry: keyturn scan --staged\n" in hooks
    assert "\n  pass_filenames: false\n" in hooks


def test_cli_diff_reads_a_file_or_stdin_and_refuses_a_missing_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """--diff FILE and --diff - scan the diff's added lines; a missing FILE exits 2."""
    token = _token.generate()
    diff = f"+++ b/app.py\n@@ -0,0 +1 @@\n+KEY = '{token.token}'\n"
    (tmp_path / "change.diff").write_text(diff)
    assert main(["scan", "--diff", str(tmp_path / "change.diff")]) == 1
    assert capsys.readouterr().out == f"app.py:1:8: {token.hint} (key id {token.key_id})\n"
    monkeypatch.setattr("sys.stdin", io.StringIO(diff.replace("+KEY", "-KEY")))
    assert main(["scan", "--diff", "-"]) == 0
    assert main(["scan", "--diff", str(tmp_path / "nope.diff")]) == 2
    assert "cannot read" in capsys.readouterr().err
    assert main(["scan", "--staged", "."]) == 2


def test_staged_does_not_count_a_renamed_file_as_added(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Moving a file adds no line, even where the user's git turns rename detection off."""
    git(tmp_path, "init", "-q")
    git(tmp_path, "config", "diff.renames", "false")
    (tmp_path / "old.py").write_text(f"KEY = '{_token.generate().token}'\n")
    git(tmp_path, "add", "old.py")
    git(tmp_path, "commit", "-q", "-m", "already committed")
    git(tmp_path, "mv", "old.py", "new.py")
    monkeypatch.chdir(tmp_path)
    assert main(["scan", "--staged"]) == 0


@given(
    before=glue,
    after=glue,
    cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=8),
)
def test_a_text_in_pieces_gives_the_findings_of_the_whole(
    before: str, after: str, cuts: list[int]
) -> None:
    """However the text is cut into chunks (inside a key, next to one, into empty pieces),
    the findings and their places are those of the whole text.
    """
    tokens = [_token.generate() for _ in range(3)]
    first, second, third = (token.token for token in tokens)
    # The last is glued to an "x": not a key, in any piece.
    text = f"{before}{first}{after}\n{second} {before} {third} x{first}"
    bounds = sorted({min(cut, len(text)) for cut in cuts})
    pieces = [text[a:b] for a, b in zip([0, *bounds], [*bounds, len(text)], strict=True)]

    assert list(_find(pieces, "f")) == list(find_keys(text, "f"))
    assert len(list(find_keys(text, "f"))) == 3


def test_a_file_over_16_mib_is_scanned_to_its_end(tmp_path: Path) -> None:
    """A key after 17 MiB of text, and one across a chunk boundary, are found at their place."""
    early, late = _token.generate(), _token.generate()
    line = "-" * 1023 + "\n"
    filler = line * (CHUNK_BYTES // len(line))
    half = len(early.token) // 2
    text = filler[:-half] + early.token + "\n" + filler * 16 + f"KEY={late.token}\n"
    (tmp_path / "dump.sql").write_text(text)
    assert (tmp_path / "dump.sql").stat().st_size > 16 * 1024 * 1024

    done = _scan_in_a_child(str(tmp_path / "dump.sql"))

    assert done.returncode == 1, done.stderr
    lines = 1024 * 17 + 1
    assert done.stdout.splitlines() == [
        f"{tmp_path / 'dump.sql'}:1024:{1025 - half}: {early.hint} (key id {early.key_id})",
        f"{tmp_path / 'dump.sql'}:{lines}:5: {late.hint} (key id {late.key_id})",
    ]


def _staged(repo: Path, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int, int, str]]:
    monkeypatch.chdir(repo)
    return [(f.source, f.line, f.column, f.key_id) for f in find_staged_keys()]


@pytest.mark.parametrize(
    ("attributes", "encoding"),
    [
        ("", "utf-16"),
        ("", "utf-16-le"),
        ("*.cfg binary\n", "utf-8"),
        ("*.cfg -diff\n", "utf-8"),
        ("*.cfg -text -diff\n", "utf-16"),
    ],
    ids=["UTF-16", "UTF-16 without BOM", "marked binary", "marked -diff", "both"],
)
def test_staged_reads_files_git_shows_as_binary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, attributes: str, encoding: str
) -> None:
    """A key in a staged UTF-16 file, or one .gitattributes marks binary or -diff (git's diff
    says only "Binary files differ"), is found as `scan FILE` finds it; the commit that
    removes it again passes.
    """
    token = _token.generate()
    git(tmp_path, "init", "-q")
    (tmp_path / ".gitattributes").write_text(attributes)
    config = tmp_path / "app.cfg"
    config.write_bytes(f"[app]\nkey = {token.token}\n".encode(encoding))
    git(tmp_path, "add", ".")

    assert _staged(tmp_path, monkeypatch) == [("app.cfg", 2, 7, token.key_id)]
    assert [(f.line, f.column) for f in scan_paths([config])] == [(2, 7)]
    assert main(["scan", "--staged"]) == 1

    git(tmp_path, "commit", "-q", "-m", "leak")
    config.write_bytes("[app]\nkey = ${KEY}\n".encode(encoding))
    git(tmp_path, "add", ".")
    assert main(["scan", "--staged"]) == 0


def test_staged_finds_a_key_added_to_a_file_holding_another(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A key already committed is not the commit's; a new one beside it is, and a key in a
    copied file is not new either.
    """
    old, new = _token.generate(), _token.generate()
    git(tmp_path, "init", "-q")
    (tmp_path / "a.env").write_text(f"OLD={old.token}\n")
    git(tmp_path, "add", ".")
    git(tmp_path, "commit", "-q", "-m", "already there")
    (tmp_path / "a.env").write_text(f"OLD={old.token}\nNEW={new.token}\n")
    git(tmp_path, "add", ".")

    assert _staged(tmp_path, monkeypatch) == [("a.env", 2, 5, new.key_id)]


def test_staged_scans_a_staged_file_over_16_mib(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A staged file past 16 MiB is read from the index to its end."""
    token = _token.generate()
    git(tmp_path, "init", "-q")
    big = ("y" * 1023 + "\n") * (17 * 1024)
    (tmp_path / "big.txt").write_text(big + token.token + "\n")
    git(tmp_path, "add", ".")

    assert _staged(tmp_path, monkeypatch) == [("big.txt", 17 * 1024 + 1, 1, token.key_id)]
