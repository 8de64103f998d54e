"""`make repo`: signed package repositories for the packages in dist/, laid out as
NVIDIA's are (one flat repository per format, one key):

  OUT/nvhook.gpg, OUT/gpgkey   the signing key's public half (binary keyring for apt's
                               signed-by, and armored for rpm --import / yum's gpgkey)
  OUT/deb/                     the .debs, Packages(.gz), Release signed as InRelease and
                               Release.gpg. A node's list:
                               deb [signed-by=/usr/share/keyrings/nvhook.gpg] URL/deb /
  OUT/rpm/                     the .rpms (each signed: rpmsign), repodata/ (createrepo_c)
                               with repomd.xml.asc; OUT/rpm/nvhook.repo for /etc/yum.repos.d

The key: the secret key in --gnupghome DIR (default OUT.key/, where a new RSA key is
generated on first use and kept, so later repositories are signed by the same key).
That directory must be the builder's own and closed to others (mode 0700), as gpg's
secret key is whoever can write there's to replace, and every directory above it root's
or the builder's and not writable by others (unless sticky), as whoever could rename
entries there could swap the directory gpg is handed.

Usage: python packaging/build_repo.py OUT PACKAGE... [--gnupghome DIR] [--url URL]
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import os
import shutil
import stat
import subprocess
import sys
import time
from email.utils import formatdate
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import fail, run, step  # noqa: E402

UID = "nvhook repository <nvhook@localhost>"
GPG = ["gpg", "--batch", "--quiet", "--pinentry-mode", "loopback", "--passphrase", ""]


def _home(path: Path) -> Path:
    """The key's GNUPGHOME: made here (0700), or an existing one that is ours and closed,
    under directories nobody else can rename it in (gpg takes a path: a directory another
    user could write above it would let them swap in, between this check and gpg's use, a
    link to any other 0700 directory of ours, such as our own ~/.gnupg)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path = Path(os.path.realpath(path.parent)) / path.name   # gpg is handed this one, no link above
    for above in reversed(path.parents):
        st = os.lstat(above)
        if st.st_uid not in (0, os.geteuid()) or (st.st_mode & 0o002 and not st.st_mode & stat.S_ISVTX):
            fail(f"{above}: above the signing key's directory, owned by uid {st.st_uid} with mode "
                 f"{stat.S_IMODE(st.st_mode):o}: another user could swap the key directory there")
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass                            # an existing one (or one made meanwhile): checked as such
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        fail(f"{path}: the signing key's directory must be a directory of this user's, mode 0700 "
             f"(owner {st.st_uid}, mode {stat.S_IMODE(st.st_mode):o}{', a link' if stat.S_ISLNK(st.st_mode) else ''})")
    return path


def _gpg(home: Path, *args: str, **kw) -> subprocess.CompletedProcess:
    r = subprocess.run([*GPG, "--homedir", str(home), *args], capture_output=True, **kw)
    if r.returncode != 0:
        err = r.stderr.decode(errors="replace").strip().splitlines()
        fail(f"gpg {args[0]} failed: {err[-1] if err else r.returncode}")
    return r


def signing_key(home: Path) -> str:
    """The fingerprint of the home's secret key (one generated where there is none)."""
    def secret() -> list[str]:
        out = subprocess.run([*GPG, "--homedir", str(home), "--with-colons", "--list-secret-keys"],
                             capture_output=True, text=True).stdout
        return [ln.split(":")[9] for ln in out.splitlines() if ln.startswith("fpr:")]

    fprs = secret()
    if not fprs:
        step("generating the repository's signing key")
        _gpg(home, "--quick-gen-key", UID, "rsa3072", "sign", "0")
        fprs = secret()
    if not fprs:
        fail(f"no secret key in {home}")
    return fprs[0]


def _digests(path: Path) -> dict[str, str]:
    data = path.read_bytes()
    return {"MD5Sum": hashlib.md5(data).hexdigest(), "SHA1": hashlib.sha1(data).hexdigest(),
            "SHA256": hashlib.sha256(data).hexdigest(), "Size": str(len(data))}


def apt_repo(dest: Path, debs: list[Path], home: Path, fpr: str) -> None:
    step(f"writing the apt repository ({len(debs)} packages)")
    dest.mkdir(parents=True)
    stanzas = []
    for deb in debs:
        shutil.copy2(deb, dest / deb.name)
        fields = subprocess.run(["dpkg-deb", "-f", str(deb)], capture_output=True, text=True, check=True).stdout
        d = _digests(dest / deb.name)
        stanzas.append(fields.rstrip("\n") + f"\nFilename: ./{deb.name}\nSize: {d['Size']}\nMD5sum: {d['MD5Sum']}"
                       f"\nSHA1: {d['SHA1']}\nSHA256: {d['SHA256']}\n")
    packages = "\n".join(stanzas).encode()
    (dest / "Packages").write_bytes(packages)
    (dest / "Packages.gz").write_bytes(gzip.compress(packages, mtime=0))
    release = [f"Origin: nvhook\nLabel: nvhook\nArchitectures: {' '.join(sorted(_arches(debs)))}\n"
               f"Date: {formatdate(time.time(), usegmt=True)}\n"]
    for algo in ("MD5Sum", "SHA1", "SHA256"):
        release.append(f"{algo}:\n")
        for name in ("Packages", "Packages.gz"):
            d = _digests(dest / name)
            release.append(f" {d[algo]} {d['Size']:>8} {name}\n")
    (dest / "Release").write_text("".join(release))
    _gpg(home, "--local-user", fpr, "--digest-algo", "SHA256", "--clearsign", "-o", str(dest / "InRelease"),
         str(dest / "Release"))
    _gpg(home, "--local-user", fpr, "--digest-algo", "SHA256", "--detach-sign", "--armor", "-o",
         str(dest / "Release.gpg"), str(dest / "Release"))


def _arches(debs: list[Path]) -> set[str]:
    return {subprocess.run(["dpkg-deb", "-f", str(d), "Architecture"], capture_output=True, text=True,
                           check=True).stdout.strip() for d in debs}


def rpm_repo(dest: Path, rpms: list[Path], home: Path, fpr: str, url: str) -> None:
    step(f"writing the rpm repository ({len(rpms)} packages)")
    for tool in ("createrepo_c", "rpmsign", "gpg"):
        if not shutil.which(tool):
            fail(f"the rpm repository needs {tool} (apt-get install createrepo-c rpm)")
    dest.mkdir(parents=True)
    for rpm in rpms:
        shutil.copy2(rpm, dest / rpm.name)
        run(["rpmsign", "--addsign", "--define", f"_gpg_name {fpr}", "--define", f"_gpg_path {home}",
             "--define", f"__gpg {shutil.which('gpg')}",
             "--define", "_gpg_sign_cmd_extra_args --batch --pinentry-mode loopback",
             str(dest / rpm.name)], timeout=300)
    run(["createrepo_c", "--quiet", "--no-database", str(dest)], timeout=600)
    _gpg(home, "--local-user", fpr, "--detach-sign", "--armor", "-o", str(dest / "repodata/repomd.xml.asc"),
         str(dest / "repodata/repomd.xml"))
    (dest / "nvhook.repo").write_text(f"[nvhook]\nname=nvhook\nbaseurl={url}/rpm\nenabled=1\ngpgcheck=1\n"
                                      f"repo_gpgcheck=1\ngpgkey={url}/gpgkey\n")


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="build_repo.py")
    ap.add_argument("out")
    ap.add_argument("packages", nargs="+", type=Path)
    ap.add_argument("--gnupghome", type=Path, help="the signing key's GNUPGHOME (default OUT.key)")
    ap.add_argument("--url", default="https://localhost/nvhook", help="where the repository is served (nvhook.repo)")
    args = ap.parse_args(argv)
    out = Path(args.out).resolve()
    debs = [p for p in args.packages if p.suffix == ".deb"]
    rpms = [p for p in args.packages if p.suffix == ".rpm"]
    for p in args.packages:
        if p.suffix not in (".deb", ".rpm") or not p.is_file():
            fail(f"{p}: not a .deb or .rpm file")
    home = _home(args.gnupghome or out.with_name(out.name + ".key"))
    fpr = signing_key(home)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    (out / "nvhook.gpg").write_bytes(_gpg(home, "--export", fpr).stdout)
    (out / "gpgkey").write_bytes(_gpg(home, "--export", "--armor", fpr).stdout)
    if debs:
        apt_repo(out / "deb", debs, home, fpr)
    if rpms:
        rpm_repo(out / "rpm", rpms, home, fpr, args.url.rstrip("/"))
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
