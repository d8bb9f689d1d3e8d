"""Package log parsers on fixture text: dpkg.log, apt history.log, dnf.rpm.log."""

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from syntrop.contextd import packages
from syntrop.contextd.packages import PackageFiles, parse_apt, parse_dnf, parse_dpkg, utc_time

DPKG = """\
2024-01-15 10:23:45 startup archives unpack
2024-01-15 10:23:45 install nginx:amd64 <none> 1.22.1-9
2024-01-15 10:23:45 status half-installed nginx:amd64 1.22.1-9
2024-01-15 10:23:46 upgrade libc6:amd64 2.36-9 2.36-9+deb12u1
2024-01-15 10:23:46 startup packages configure
2024-01-15 10:23:46 configure nginx:amd64 1.22.1-9 <none>
2024-01-15 10:23:46 status unpacked nginx:amd64 1.22.1-9
2024-01-15 10:23:46 conffile /etc/nginx/nginx.conf keep
2024-01-15 10:23:47 conffile /etc/default/foo install
2024-01-15 10:23:47 status installed nginx:amd64 1.22.1-9
2024-01-15 10:23:47 trigproc man-db:amd64 2.11.2-2 <none>
2024-01-15 10:23:47 startup archives unpack
2024-01-15 10:23:47 conffile /etc/orphan.conf keep
2024-01-15 10:23:48 remove foo:amd64 1.0 <none>
2024-01-15 10:23:48 purge foo:all 1.0 <none>
2024-01-15 10:23:49 upgrade bar:amd64 2.0 2.0
2024-01-15 10:23:50 upgrade pl-tool:all 2.0 1.0
2024-01-15 10:23:51 upgrade odd:all 2.0 not-a-version!
"""


def test_dpkg_records_each_decision() -> None:
    parsed = parse_dpkg(DPKG, utc_time)
    assert parsed.skipped == 0
    got = [(r.action, r.package, r.arch, r.old_version, r.new_version, r.path)
           for r in parsed.records]
    assert got == [
        ("install", "nginx", "amd64", None, "1.22.1-9", None),
        ("upgrade", "libc6", "amd64", "2.36-9", "2.36-9+deb12u1", None),
        ("conffile", "nginx", "amd64", None, None, "/etc/nginx/nginx.conf"),
        ("conffile", "nginx", "amd64", None, None, "/etc/default/foo"),
        ("conffile", None, None, None, None, "/etc/orphan.conf"),
        ("remove", "foo", "amd64", "1.0", None, None),
        ("purge", "foo", "all", "1.0", None, None),
        ("reinstall", "bar", "amd64", "2.0", "2.0", None),
        # dpkg's log calls a downgrade "upgrade": the versions tell.
        ("downgrade", "pl-tool", "all", "2.0", "1.0", None),
        ("upgrade", "odd", "all", "2.0", "not-a-version!", None),
    ]
    assert parsed.records[0].timestamp_usec == 1705314225 * 1_000_000
    assert parsed.records[1].summary == "package libc6 upgraded 2.36-9 → 2.36-9+deb12u1"
    # A conffile decision belongs to the package dpkg is configuring.
    assert parsed.records[2].summary == "dpkg conffile /etc/nginx/nginx.conf of nginx: " \
        "kept the local one"
    assert "installed the package's version" in parsed.records[3].summary


def test_dpkg_counts_lines_in_unexpected_formats() -> None:
    text = (
        "garbage\n"
        "2024-13-45 10:23:45 install x:amd64 <none> 1\n"  # no such date
        "2024-01-15 10:23:45 install onlyname\n"  # too few words
        "2024-01-15 10:23:45 frobnicate x y z\n"  # unknown verb
        "2024-01-15 10:23:45 conffile relative keep\n"
        "\x00\xff binary\n"
        "2024-01-15 10:23:45 install ok:amd64 <none> 1\n"
    )
    parsed = parse_dpkg(text, utc_time)
    assert parsed.skipped == 6
    assert [r.package for r in parsed.records] == ["ok"]


@given(st.text())
def test_dpkg_never_raises(text: str) -> None:
    parsed = parse_dpkg(text, utc_time)
    assert parsed.skipped >= 0


APT = """\

Start-Date: 2024-01-15  10:23:40
Commandline: apt-get install nginx
Requested-By: admin (1000)
Install: nginx:amd64 (1.22.1-9), nginx-common:all (1.22.1-9, automatic)
Upgrade: libc6:amd64 (2.36-9, 2.36-9+deb12u1)
End-Date: 2024-01-15  10:23:50

Start-Date: 2024-01-16  09:00:00
Commandline: apt-get purge foo
Purge: foo:amd64 (1.0)
End-Date: 2024-01-16  09:00:01

Start-Date: 2024-01-17  09:00:00
Commandline: apt-get install still-running
Install: partial:amd64 (1.0)
"""


def test_apt_transactions_and_an_unfinished_stanza() -> None:
    data = APT.encode()
    complete = packages.apt_complete(data)
    assert data[:complete].endswith(b"End-Date: 2024-01-16  09:00:01\n")
    parsed = parse_apt(packages.split_apt(data[:complete].decode()), utc_time)
    assert parsed.skipped == 0
    first, second = parsed.records
    assert first.action == "transaction" and first.command == "apt-get install nginx"
    assert first.packages == ("nginx:amd64", "nginx-common:all", "libc6:amd64")
    assert first.timestamp_usec == 1705314220 * 1_000_000
    assert "install nginx, install nginx-common, upgrade libc6" in first.summary
    assert second.packages == ("foo:amd64",)


def test_apt_stanza_without_packages_or_date_is_skipped() -> None:
    stanzas = ["Start-Date: 2024-01-15  10:23:40\nCommandline: apt-get update\nEnd-Date: x\n",
               "Start-Date: never\nInstall: a:amd64 (1)\nEnd-Date: x\n"]
    parsed = parse_apt(stanzas, utc_time)
    assert parsed.records == [] and parsed.skipped == 2


DNF = """\
2024-01-15T10:23:45+0000 SUBDEBUG Installed: nginx-1:1.20.1-14.el9.x86_64
2024-01-15T10:23:46+0000 SUBDEBUG Upgrade: openssl-libs-1:3.0.7-25.el9.x86_64
2024-01-15T10:23:46+0000 SUBDEBUG Upgraded: openssl-libs-1:3.0.7-24.el9.x86_64
2024-01-15T10:23:47+01:00 SUBDEBUG Erase: foo-1.0-1.noarch
2024-01-15T10:23:47Z INFO --- logging initialized ---
not a line
"""


def test_dnf_records() -> None:
    parsed = parse_dnf(DNF)
    got = [(r.action, r.package, r.arch, r.old_version, r.new_version) for r in parsed.records]
    assert got == [
        ("install", "nginx", "x86_64", None, "1:1.20.1-14.el9"),
        ("upgrade", "openssl-libs", "x86_64", None, "1:3.0.7-25.el9"),
        ("remove", "foo", "noarch", "1.0-1", None),
    ]
    assert parsed.records[0].timestamp_usec == 1705314225 * 1_000_000
    assert parsed.records[2].timestamp_usec == (1705314227 - 3600) * 1_000_000
    assert parsed.skipped == 2


def test_package_files_reads_the_dpkg_list(tmp_path: Path) -> None:
    info = tmp_path / "info"
    info.mkdir()
    (info / "nginx.list").write_text(
        "/.\n/lib/systemd/system/nginx.service\n/usr/sbin/nginx\n/etc/nginx/nginx.conf\n"
        "/usr/share/doc/nginx/copyright\n")
    (info / "libfoo:amd64.list").write_text("/usr/lib/systemd/system/foo@.service\n")
    files = PackageFiles(str(info), ("/etc/",))
    assert files.of("nginx:amd64") == (
        frozenset({"nginx.service"}), frozenset({"/usr/sbin/nginx", "/etc/nginx/nginx.conf"}))
    assert files.of("libfoo:amd64")[0] == frozenset({"foo@.service"})
    assert files.of("absent") == (frozenset(), frozenset())
