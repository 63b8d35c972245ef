"""Check a rewrite of the migrations (a squash) against the revision before it.

    .venv/bin/python scripts/compare_migrations.py REV

Builds three scratch databases on the server of ``DATABASE_URL`` (default
``postgres://127.0.0.1:5432/``): ``<prefix>_old`` migrated by REV's migrations (from ``git archive
REV``), ``<prefix>_new`` migrated by the working tree's; it compares what they hold (columns,
indexes, constraints, triggers, functions, row counts, the roles' permissions; column order
aside), then migrates the old one with the working tree's migrations, which must find nothing to
apply and leave every migration applied (``migrate --check``). The prefix is
``KICI_COMPARE_DATABASE`` (default ``kici_compare_migrations``); the databases are dropped at the
end. Exits 1 naming the first difference.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg

ROOT = Path(__file__).resolve().parent.parent
PYTHON = ROOT / ".venv" / "bin" / "python"

SCHEMA_QUERIES = {
    "columns": """SELECT table_name, column_name, data_type, character_maximum_length, numeric_precision,
                         numeric_scale, is_nullable, column_default
                  FROM information_schema.columns WHERE table_schema = 'public'""",
    "indexes": "SELECT tablename, indexname, indexdef FROM pg_indexes WHERE schemaname = 'public'",
    "constraints": """SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid) FROM pg_constraint
                      WHERE connamespace = 'public'::regnamespace""",
    "triggers": "SELECT tgrelid::regclass::text, tgname, pg_get_triggerdef(oid) FROM pg_trigger WHERE NOT tgisinternal",
    "functions": "SELECT proname, pg_get_functiondef(oid) FROM pg_proc WHERE pronamespace = 'public'::regnamespace",
    "roles": """SELECT g.name, ct.app_label, p.codename FROM auth_group g
                JOIN auth_group_permissions gp ON gp.group_id = g.id JOIN auth_permission p ON p.id = gp.permission_id
                JOIN django_content_type ct ON ct.id = p.content_type_id""",
}


def database_url(name: str) -> str:
    base = urlsplit(os.environ.get("DATABASE_URL", "postgres://127.0.0.1:5432/"))
    return urlunsplit(base._replace(path=f"/{name}"))


def recreate(name: str, drop_only: bool = False) -> None:
    with psycopg.connect(database_url("postgres"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        if not drop_only:
            conn.execute(f'CREATE DATABASE "{name}"')


def manage(checkout: Path, database: str, *args: str) -> str:
    """Run ``manage.py`` of ``checkout`` on ``database``; raises CalledProcessError with its output."""
    env = {**os.environ, "DATABASE_URL": database_url(database), "SECRET_KEY": "compare-migrations-only"}
    proc = subprocess.run([str(PYTHON), "manage.py", *args], cwd=checkout, env=env, capture_output=True, text=True)
    if proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, proc.args, proc.stdout, proc.stderr)
    return proc.stdout


def contents(database: str) -> dict[str, list[tuple]]:
    """What the migrations made, order-free: schema objects, row counts (django_migrations aside)."""
    found: dict[str, list[tuple]] = {}
    with psycopg.connect(database_url(database)) as conn:
        for what, query in SCHEMA_QUERIES.items():
            found[what] = sorted(conn.execute(query).fetchall(), key=repr)
        tables = [r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")]
        found["rows"] = sorted(
            (t, conn.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0]) for t in tables if t != "django_migrations"
        )
    return found


def differences(old: dict[str, list[tuple]], new: dict[str, list[tuple]]) -> list[str]:
    lines = []
    for what in old:
        gone, added = set(old[what]) - set(new[what]), set(new[what]) - set(old[what])
        lines += [f"{what}: only before: {row}" for row in sorted(gone, key=repr)]
        lines += [f"{what}: only after: {row}" for row in sorted(added, key=repr)]
    return lines


def main(rev: str) -> int:
    prefix = os.environ.get("KICI_COMPARE_DATABASE", "kici_compare_migrations")
    old_db, new_db = f"{prefix}_old", f"{prefix}_new"
    with tempfile.TemporaryDirectory(prefix="kici-migrations-") as tmp:
        archive = subprocess.run(["git", "archive", rev], cwd=ROOT, check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        try:
            for name in (old_db, new_db):
                recreate(name)
            manage(Path(tmp), old_db, "migrate", "-v0")
            manage(ROOT, new_db, "migrate", "-v0")
            found = differences(contents(old_db), contents(new_db))
            if found:
                print(f"a fresh database differs from one {rev} migrated:\n" + "\n".join(found))
                return 1
            print(f"a fresh database holds what one {rev} migrated holds (column order aside)")
            before = contents(old_db)
            print(manage(ROOT, old_db, "migrate").strip().splitlines()[-1])
            manage(ROOT, old_db, "migrate", "--check")
            shown = manage(ROOT, old_db, "showmigrations")
            if "[ ]" in shown or differences(before, contents(old_db)):
                print(f"the database {rev} migrated is not taken as migrated:\n{shown}")
                return 1
            print(f"a database {rev} migrated is fully migrated for this tree, unchanged:\n{shown}")
            return 0
        except subprocess.CalledProcessError as exc:
            print(f"{' '.join(map(str, exc.cmd))} failed ({exc.returncode}):\n{exc.stdout}{exc.stderr}")
            return 1
        finally:
            for name in (old_db, new_db):
                recreate(name, drop_only=True)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1]))
