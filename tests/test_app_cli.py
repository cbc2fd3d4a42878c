import pytest

import app


def test_public_host_needs_auth_or_explicit_no_auth(capsys):
    with pytest.raises(SystemExit):
        app.parse_args(["--host", "0.0.0.0"])
    assert "--auth" in capsys.readouterr().err
    assert app.parse_args(["--host", "0.0.0.0", "--auth", "me:secret"]).logins == [("me", "secret")]
    assert app.parse_args(["--host", "0.0.0.0", "--no-auth"]).no_auth
    assert app.parse_args([]).host == "127.0.0.1"


def test_auth_must_be_user_colon_pass(capsys):
    with pytest.raises(SystemExit):
        app.parse_args(["--auth", "nopass"])
    assert "user:pass" in capsys.readouterr().err


def test_auth_file_and_repeated_auth_give_every_login(tmp_path, capsys):
    users = tmp_path / "users.txt"
    users.write_text("# team\nana:pw1\n\n bo : p:w2\n", encoding="utf-8")
    args = app.parse_args(["--auth", "me:secret", "--auth-file", str(users)])
    assert args.logins == [("me", "secret"), ("ana", "pw1"), ("bo", " p:w2")]
    assert app.parse_args(["--host", "0.0.0.0", "--auth-file", str(users)]).logins
    users.write_text("ana:pw1\nnocolon\n", encoding="utf-8")
    with pytest.raises(SystemExit):
        app.parse_args(["--auth-file", str(users)])
    assert "line 2" in capsys.readouterr().err


def test_allow_path_must_be_a_folder(tmp_path, capsys):
    assert app.parse_args(["--allow-path", str(tmp_path)]).allow_path == [str(tmp_path)]
    with pytest.raises(SystemExit):
        app.parse_args(["--allow-path", str(tmp_path / "missing")])
    assert "missing: not a folder" in capsys.readouterr().err
