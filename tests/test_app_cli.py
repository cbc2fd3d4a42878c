import pytest

import app


def test_public_host_needs_auth_or_explicit_no_auth(capsys):
    with pytest.raises(SystemExit):
        app.parse_args(["--host", "0.0.0.0"])
    assert "--auth" in capsys.readouterr().err
    assert app.parse_args(["--host", "0.0.0.0", "--auth", "me:secret"]).auth == "me:secret"
    assert app.parse_args(["--host", "0.0.0.0", "--no-auth"]).no_auth
    assert app.parse_args([]).host == "127.0.0.1"


def test_auth_must_be_user_colon_pass(capsys):
    with pytest.raises(SystemExit):
        app.parse_args(["--auth", "nopass"])
    assert "user:pass" in capsys.readouterr().err
