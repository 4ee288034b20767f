"""`hypertrace certs`: a CA and certificates for mutual TLS, for a test or a small site.

    hypertrace certs init  --dir DIR                       # DIR/ca.crt, DIR/ca.key
    hypertrace certs issue --dir DIR --role analyzer --name main --host analyzer.example.org
    hypertrace certs issue --dir DIR --role agent --name node-0001     # one per GPU node
    hypertrace certs issue --dir DIR --role reader --name alice        # report readers

One naming scheme from here to every config, unit and manifest: ``issue`` writes a folder per
certificate, ``DIR/ROLE-NAME/``, holding ``ca.crt``, ``ROLE.crt`` and ``ROLE.key``. Those three
files go, under those names, to ``/etc/hypertrace/pki/`` of the machine that uses them (the
agent's config names ``agent.crt``, the analyzer's unit ``analyzer.crt``), or into the
Kubernetes Secret (``--from-file=DIR/ROLE-NAME/``).

Each certificate carries one SPIFFE ID, ``spiffe://TRUST_DOMAIN/ROLE/NAME``, as a URI SAN; the
analyzer authorizes by it (an agent may send windows of node NAME only; ``reader`` and ``admin``
may read reports). ``--host`` adds DNS or IP names that clients dial (the analyzer's). Keys are
EC P-256, written 0600; certificates are valid for ``--days`` (default 365; the CA 3650).

With an existing PKI: issue the same URI SAN from it and point ``tls_ca``/``tls_cert``/``tls_key``
at its PEM files; nothing here is needed. The files are made with the ``openssl`` command, which
must be on PATH.
"""
from __future__ import annotations

import argparse
import ipaddress
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


def register(subparsers) -> None:
    p = subparsers.add_parser("certs", help="make a CA and mTLS certificates (tests, small sites)",
                              description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="certs_command", metavar="init|issue")
    init = sub.add_parser("init", help="create DIR/ca.crt and DIR/ca.key")
    init.add_argument("--dir", required=True, help="where the CA files go (created 0700)")
    init.add_argument("--days", type=int, default=3650, help="CA validity (default 3650)")
    init.set_defaults(func=run_init)
    issue = sub.add_parser("issue", help="create DIR/ROLE-NAME/ with ca.crt, ROLE.crt and "
                           "ROLE.key, signed by the CA")
    issue.add_argument("--dir", required=True, help="the directory of `certs init`")
    issue.add_argument("--role", required=True, choices=["agent", "reader", "admin", "analyzer"])
    issue.add_argument("--name", required=True,
                       help="the node name for an agent (as in its windows), else any name")
    issue.add_argument("--host", action="append", default=[], metavar="DNS-OR-IP",
                       help="a name clients dial (repeatable; the analyzer's host)")
    issue.add_argument("--trust-domain", default="hypertrace",
                       help="SPIFFE trust domain (default hypertrace)")
    issue.add_argument("--days", type=int, default=365, help="validity (default 365)")
    issue.set_defaults(func=run_issue)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def _openssl(*args: str) -> None:
    if shutil.which("openssl") is None:
        raise RuntimeError("the openssl command is not on PATH; install it (Debian: apt install "
                           "openssl) or issue the certificates from your PKI")
    done = subprocess.run(["openssl", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"openssl {args[0]} failed: {done.stderr.strip()[:500]}")


def _safe(name: str) -> bool:
    return bool(name) and len(name) <= 128 and all(c.isalnum() or c in "-_." for c in name)


def run_init(args: argparse.Namespace) -> int:
    d = Path(args.dir)
    if (d / "ca.key").exists():
        print(f"hypertrace certs: {d / 'ca.key'} exists; refusing to replace a CA (delete it "
              "first if you mean to, and re-issue every certificate)", file=sys.stderr)
        return 2
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    old = os.umask(0o077)
    try:
        _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
                 "-nodes", "-keyout", str(d / "ca.key"), "-out", str(d / "ca.crt"),
                 "-days", str(args.days), "-subj", "/CN=hypertrace CA",
                 "-addext", "basicConstraints=critical,CA:TRUE",
                 "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    except RuntimeError as exc:
        print(f"hypertrace certs: {exc}", file=sys.stderr)
        return 1
    finally:
        os.umask(old)
    os.chmod(d / "ca.crt", 0o644)
    print(f"CA: {d / 'ca.crt'} (key {d / 'ca.key'}, keep it off the nodes)")
    return 0


def run_issue(args: argparse.Namespace) -> int:
    d = Path(args.dir)
    if not (d / "ca.key").exists():
        print(f"hypertrace certs: no CA in {d}; run `hypertrace certs init --dir {d}` first",
              file=sys.stderr)
        return 2
    if not _safe(args.name) or not _safe(args.trust_domain):
        print("hypertrace certs: --name and --trust-domain may hold letters, digits, '-', '_' "
              "and '.' only (at most 128)", file=sys.stderr)
        return 2
    sans = [f"URI:spiffe://{args.trust_domain}/{args.role}/{args.name}"]
    for host in args.host:
        try:
            sans.append(f"IP:{ipaddress.ip_address(host)}")
        except ValueError:
            if not _safe(host):
                print(f"hypertrace certs: --host {host!r} is not a DNS name or IP address",
                      file=sys.stderr)
                return 2
            sans.append(f"DNS:{host}")
    try:
        bundle = issue(d, d / f"{args.role}-{args.name}", args.role, args.name, sans,
                       args.days)
    except RuntimeError as exc:
        print(f"hypertrace certs: {exc}", file=sys.stderr)
        return 1
    print(f"{bundle}/: ca.crt, {args.role}.crt ({sans[0][4:]}), {args.role}.key; copy the "
          f"three files to /etc/hypertrace/pki/ where the {args.role} runs "
          f"({args.role}.key mode 0600)")
    return 0


def issue(ca_dir: Path, bundle: Path, role: str, name: str, sans: list[str],
          days: int = 365) -> Path:
    """Sign a certificate for ``role``/``name`` with the CA in ``ca_dir`` and write the bundle
    ``bundle/{ca.crt, ROLE.crt, ROLE.key}`` (the folder and key 0700/0600). ``sans``: its
    subjectAltName entries, the SPIFFE URI first. Raises RuntimeError naming what failed."""
    usage = "serverAuth" if role == "analyzer" else "clientAuth"
    bundle.mkdir(parents=True, exist_ok=True, mode=0o700)
    stem = bundle / role
    old = os.umask(0o077)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            ext = Path(tmp) / "ext.cnf"
            ext.write_text(f"subjectAltName={','.join(sans)}\n"
                           "basicConstraints=critical,CA:FALSE\n"
                           "keyUsage=critical,digitalSignature\n"
                           f"extendedKeyUsage={usage}\n")
            csr = Path(tmp) / "req.csr"
            _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                     "-keyout", f"{stem}.key", "-out", str(csr),
                     "-subj", f"/CN={role}-{name}")
            _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca_dir / "ca.crt"),
                     "-CAkey", str(ca_dir / "ca.key"), "-CAcreateserial", "-out", f"{stem}.crt",
                     "-days", str(days), "-extfile", str(ext))
    finally:
        os.umask(old)
    shutil.copyfile(ca_dir / "ca.crt", bundle / "ca.crt")
    os.chmod(bundle / "ca.crt", 0o644)
    os.chmod(f"{stem}.crt", 0o644)
    return bundle
