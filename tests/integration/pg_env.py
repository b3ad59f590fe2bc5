"""A throwaway PostgreSQL server for the tests of the PostgreSQL store
(test_pg_store.py): Debian's postgresql 15, its data directory and unix
socket in a temporary directory owned by the `postgres` user (initdb and
the server refuse to run as root), listening on 127.0.0.1 on a free port.
start / stop / restart, and SQL through psql.

Not responsible for: the controllers (controller_env.py).
"""

import os
import pwd
import shutil
import subprocess
import tempfile

from helpers import free_port, wait_until

PG_BIN = "/usr/lib/postgresql/15/bin"


def pg_missing():
    """None when a server can be started here, else why not."""
    for tool in ("initdb", "pg_ctl", "postgres"):
        if not os.path.exists(os.path.join(PG_BIN, tool)):
            return "PostgreSQL 15 binaries missing (%s/%s): apt-get install postgresql" % (
                PG_BIN, tool)
    if shutil.which("psql") is None:
        return "psql missing: apt-get install postgresql-client"
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        return "no postgres user (installed with the postgresql package)"
    if os.geteuid() != 0 and pwd.getpwuid(os.geteuid()).pw_name != "postgres":
        return "starting PostgreSQL needs root (runuser -u postgres) or the postgres user"
    return None


class Postgres:
    def __init__(self, workdir=None):
        # Its own directory under /tmp rather than pytest's numbered base
        # directory: a concurrent pytest session prunes old base directories
        # (changing their modes as it goes), which a server running as
        # another user does not survive. `workdir` is not used for data.
        del workdir
        self.dir = tempfile.mkdtemp(prefix="sluice-pg-")
        pw = pwd.getpwnam("postgres")
        # Every component on the way must be traversable by postgres.
        d = self.dir
        while d not in ("/", ""):
            st = os.stat(d)
            if not st.st_mode & 0o001:
                os.chmod(d, st.st_mode | 0o001)
            d = os.path.dirname(d)
        os.chown(self.dir, pw.pw_uid, pw.pw_gid)
        os.chmod(self.dir, 0o700)
        self.data = os.path.join(self.dir, "data")
        self.sock = self.dir
        self.port = free_port()
        self.log = os.path.join(self.dir, "server.log")
        self.user = "sluice"
        self.db = "sluice"

    def _as_postgres(self, argv, check=True, timeout=60):
        prefix = [] if pwd.getpwuid(os.geteuid()).pw_name == "postgres" else \
            ["runuser", "-u", "postgres", "--"]
        r = subprocess.run(prefix + argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise RuntimeError("%s: %s" % (" ".join(argv), r.stdout[-2000:]))
        return r

    def init(self):
        self._as_postgres([os.path.join(PG_BIN, "initdb"), "-D", self.data, "-A", "trust",
                           "-U", "postgres", "--no-sync", "-E", "UTF8"])
        with open(os.path.join(self.data, "postgresql.conf"), "a") as f:
            f.write("\nlisten_addresses = '127.0.0.1'\nport = %d\n"
                    "unix_socket_directories = '%s'\nfsync = off\nmax_connections = 40\n"
                    "shared_buffers = 16MB\n" % (self.port, self.sock))
        self.start()
        self.sql("CREATE ROLE %s LOGIN" % self.user, db="postgres")
        self.sql("CREATE DATABASE %s OWNER %s" % (self.db, self.user), db="postgres")
        return self

    def start(self):
        self._as_postgres([os.path.join(PG_BIN, "pg_ctl"), "-D", self.data, "-l", self.log,
                           "-w", "-t", "30", "start"])

    def stop(self, mode="fast"):
        self._as_postgres([os.path.join(PG_BIN, "pg_ctl"), "-D", self.data, "-m", mode, "-w",
                           "-t", "30", "stop"], check=False)

    def running(self):
        return os.path.exists(os.path.join(self.data, "postmaster.pid"))

    def url(self, db=None):
        return "postgres://%s@127.0.0.1:%d/%s?connect_timeout=2" % (self.user, self.port,
                                                                    db or self.db)

    def sql(self, statement, db=None):
        """Runs statement with psql as the superuser; its output (unaligned,
        tuples only)."""
        r = self._as_postgres(["psql", "-h", self.sock, "-p", str(self.port), "-U", "postgres",
                               "-d", db or self.db, "-v", "ON_ERROR_STOP=1", "-At", "-c",
                               statement])
        return r.stdout.strip()

    def wait_up(self, timeout=30):
        wait_until(lambda: self._as_postgres(
            [os.path.join(PG_BIN, "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port)],
            check=False).returncode == 0, timeout, interval=0.2, what="PostgreSQL accepting")

    def close(self):
        if self.running():
            self.stop("immediate")
        shutil.rmtree(self.dir, ignore_errors=True)
