"""Secure without configuration (issue 32, item 4): an operator started
without ``--state-key-file`` seals and checks state with a key of its own,
kept in ``$XDG_STATE_HOME/vramguard/state-key`` so that a restart obeys what it
wrote before; where that cannot be written, a key held in memory (state from
before the start is then not obeyed). Either way, state it cannot verify is
never obeyed, and the log says which."""

from __future__ import annotations

import os
import stat

from vramguard_operator.controller.settings import MIN_STATE_KEY_BYTES, default_key_path, default_state_key


def test_the_key_path_follows_xdg_state_home(tmp_path):
    assert default_key_path({"XDG_STATE_HOME": str(tmp_path)}) == str(tmp_path / "vramguard" / "state-key")
    assert default_key_path({}).endswith(os.path.join(".local", "state", "vramguard", "state-key"))


def test_a_key_is_generated_once_kept_private_and_reused(tmp_path):
    path = str(tmp_path / "vramguard" / "state-key")
    key, note = default_state_key(path)
    assert len(key) >= MIN_STATE_KEY_BYTES and "generated one and kept it in" in note and path in note
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    again, note = default_state_key(path)  # a restart: the same key, so its own state is obeyed
    assert again == key and "using the one kept in" in note
    other, _ = default_state_key(str(tmp_path / "elsewhere" / "state-key"))
    assert other != key


def test_a_short_key_file_is_replaced(tmp_path):
    path = tmp_path / "state-key"
    path.write_text("short\n")
    key, note = default_state_key(str(path))
    assert key != b"short" and len(key) >= MIN_STATE_KEY_BYTES and "generated" in note
    assert path.read_bytes().strip() == key


def test_an_unwritable_place_gives_a_key_in_memory(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    key, note = default_state_key(str(blocker / "vramguard" / "state-key"))  # a directory under a file
    assert len(key) >= MIN_STATE_KEY_BYTES
    assert "a key held in memory only" in note and "not obeyed" in note
