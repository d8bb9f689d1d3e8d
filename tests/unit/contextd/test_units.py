"""Unit names, roles of paths in unit directories, references, keys."""

import pytest

from syntrop.contextd import units


@pytest.mark.parametrize("name", [
    "nginx.service", "foo@bar.service", "foo@.service", "a-b.c_d:e.socket", "dev-sda1.device",
    "system-getty.slice", "x\\x2dy.mount"])
def test_valid_unit_names(name: str) -> None:
    assert units.is_unit_name(name)


@pytest.mark.parametrize("name", [
    "", "nginx", "nginx.conf", "foo.service~", ".service", "a/b.service", "a b.service",
    "x" * 250 + ".service", "foo..service", "4913", "sed3Hq2Xn"])
def test_invalid_unit_names(name: str) -> None:
    assert not units.is_unit_name(name)


def test_template_is_not_a_runtime_name() -> None:
    assert units.is_instance_or_plain("foo@bar.service")
    assert not units.is_instance_or_plain("foo@.service")


def test_roles() -> None:
    assert units.role(("nginx.service",)) == units.Role(
        "unit_file", "nginx.service", "unit:nginx.service", "unit file")
    drop_in = units.role(("nginx.service.d", "override.conf"))
    assert drop_in is not None and drop_in.key == "unit:nginx.service"
    for_all = units.role(("service.d", "10-all.conf"))
    assert for_all is not None and for_all.key == "unit:*.service"
    dashed = units.role(("foo-.service.d", "x.conf"))
    assert dashed is not None and dashed.unit == "foo-.service"
    link = units.role(("multi-user.target.wants", "nginx.service"))
    assert link is not None and link.key == "wants:nginx.service" and link.kind == "unit_file"
    # What systemd ignores, we ignore: backups, temporaries, non-.conf drop-ins.
    assert units.role(("nginx.service~",)) is None
    assert units.role(("nginx.service.d", "override.conf.dpkg-old")) is None
    assert units.role(("nginx.service.d", ".override.conf.swp")) is None
    assert units.role(("a", "b", "c.service")) is None


def test_unit_keys_cover_templates_prefixes_and_types() -> None:
    keys = units.unit_keys("foo-bar@x.service")
    assert keys["unit:foo-bar@x.service"] == 1.0
    assert keys["unit:foo-bar@.service"] == units.WEIGHTS["template"]
    assert keys["unit:foo-.service"] == units.WEIGHTS["prefix"]
    assert keys["unit:*.service"] == units.WEIGHTS["type"]
    assert keys["pkg:foo-bar"] == units.WEIGHTS["pkg"]
    assert "unit:other.service" not in keys


def test_references() -> None:
    text = """\
[Service]
# EnvironmentFile=/etc/commented
EnvironmentFile=-/etc/default/foo
EnvironmentFile=/etc/glob/*.env
ExecStartPre=+/usr/bin/check --config=/etc/foo/check.conf
ExecStart=/usr/sbin/food -c /etc/foo/food.conf \\
    --other /var/lib/foo
ExecReload=/bin/kill -HUP $MAINPID
"""
    refs = units.references(text, ("/etc/",))
    assert refs.configs == ("/etc/default/foo", "/etc/foo/check.conf", "/etc/foo/food.conf")
    assert refs.programs == ("/usr/bin/check", "/usr/sbin/food", "/bin/kill")
