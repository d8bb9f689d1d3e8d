import pytest

from syntrop.system.systemd import unit_name_from_path


@pytest.mark.parametrize(("path", "unit"), [
    ("/org/freedesktop/systemd1/unit/nginx_2eservice", "nginx.service"),
    ("/org/freedesktop/systemd1/unit/web_40blue_2dgreen_2eservice", "web@blue-green.service"),
    ("/org/freedesktop/systemd1/unit/a_5fb_2eservice", "a_b.service"),
    ("/org/freedesktop/systemd1/unit/trailing_", "trailing_"),
    ("/org/freedesktop/systemd1/job/42", None),
    ("/org/freedesktop/systemd1", None),
])
def test_unit_name_from_path(path: str, unit: str | None) -> None:
    assert unit_name_from_path(path) == unit
