"""A throwaway certificate authority for TLS tests, made with the openssl command line: the CA,
a server certificate for 127.0.0.1 and a client certificate, all valid for one day."""

from __future__ import annotations

import pathlib
import subprocess

# Small, fast keys: the tests check the client's TLS settings, not the crypto.
_EC_KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


class TestPki:
    """Files in `folder`: ca.pem, server.pem/server.key (SAN IP:127.0.0.1), client.pem/
    client.key (clientAuth)."""

    __test__ = False  # not a pytest test class

    def __init__(self, folder: pathlib.Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self.ca = folder / "ca.pem"
        self.server_cert, self.server_key = folder / "server.pem", folder / "server.key"
        self.client_cert, self.client_key = folder / "client.pem", folder / "client.key"
        self._openssl("req", "-x509", *_EC_KEY, "-days", "1", "-subj", "/CN=jobbroker test CA",
                      "-keyout", "ca.key", "-out", "ca.pem")
        self._sign("server", "subjectAltName=IP:127.0.0.1")
        self._sign("client", "extendedKeyUsage=clientAuth")

    def _openssl(self, *args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=self.folder)

    def _sign(self, name: str, extension: str) -> None:
        self._openssl("req", *_EC_KEY, "-subj", f"/CN=jobbroker test {name}",
                      "-keyout", f"{name}.key", "-out", f"{name}.csr")
        (self.folder / f"{name}.ext").write_text(extension + "\n")
        self._openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                      "-CAcreateserial", "-days", "1", "-extfile", f"{name}.ext",
                      "-out", f"{name}.pem")

    def broker_flags(self) -> list[str]:
        """TLS with required client certificates signed by this CA."""
        return ["--tls-cert", str(self.server_cert), "--tls-key", str(self.server_key),
                "--tls-client-ca", str(self.ca)]
