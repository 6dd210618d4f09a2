"""SASL_SSL for the local Apache Kafka cluster (``python -m stream broker --kind kafka --sasl``), made at start:

- a self-signed certificate for 127.0.0.1 (``keytool``, which the JDK that runs Kafka brings), in a PKCS12
  keystore the nodes share, and its PEM for clients (``ssl.ca.location``); librdkafka checks the address;
- client and inter-broker traffic on a ``SASL_SSL`` listener with SCRAM-SHA-512; the controller quorum on a
  ``SASL_PLAINTEXT`` listener with PLAIN (KRaft controllers cannot do SCRAM: its credentials live in the
  metadata the quorum serves);
- KRaft's ``StandardAuthorizer`` with no ACL meaning no access: only the ``admin`` super user may do anything
  until ACLs say otherwise. Its SCRAM credential is written into the storage at format time; others are added
  with `add_user`.

Passwords are random per cluster and live only in memory and in the nodes' own (private) folders.
"""

from __future__ import annotations

import secrets
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stream.errors import BrokerError

MECHANISM = "SCRAM-SHA-512"
ADMIN = "admin"


@dataclass(frozen=True)
class LocalSecurity:
    root: Path
    admin_password: str
    store_password: str

    @property
    def keystore(self) -> Path:
        return self.root / "broker.p12"

    @property
    def ca(self) -> Path:
        return self.root / "ca.pem"

    def client_config(self, user: str, password: str) -> dict[str, Any]:
        """librdkafka settings for ``user`` on the cluster's SASL_SSL listener."""
        return {"security.protocol": "SASL_SSL", "sasl.mechanism": MECHANISM, "sasl.username": user,
                "sasl.password": password, "ssl.ca.location": str(self.ca)}

    def admin_config(self) -> dict[str, Any]:
        return self.client_config(ADMIN, self.admin_password)

    def env(self, user: str, password: str) -> dict[str, str]:
        """The same as ``KAFKA_*`` variables (the worker, the producers and the verifier read them)."""
        return {"KAFKA_" + k.upper().replace(".", "_"): str(v) for k, v in self.client_config(user, password).items()}

    def properties(self, port: int, controller_port: int) -> list[str]:
        """A node's listener, SASL, TLS and authorizer lines."""
        jaas_plain = (f'org.apache.kafka.common.security.plain.PlainLoginModule required username="{ADMIN}" '
                      f'password="{self.admin_password}" user_{ADMIN}="{self.admin_password}";')
        jaas_scram = (f'org.apache.kafka.common.security.scram.ScramLoginModule required username="{ADMIN}" '
                      f'password="{self.admin_password}";')
        return [
            f"listeners=SASL_SSL://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
            f"advertised.listeners=SASL_SSL://127.0.0.1:{port}",
            "controller.listener.names=CONTROLLER",
            "inter.broker.listener.name=SASL_SSL",
            "listener.security.protocol.map=SASL_SSL:SASL_SSL,CONTROLLER:SASL_PLAINTEXT",
            f"sasl.enabled.mechanisms={MECHANISM}",
            f"sasl.mechanism.inter.broker.protocol={MECHANISM}",
            f"listener.name.sasl_ssl.{MECHANISM.lower()}.sasl.jaas.config={jaas_scram}",
            "sasl.mechanism.controller.protocol=PLAIN",
            "listener.name.controller.sasl.enabled.mechanisms=PLAIN",
            f"listener.name.controller.plain.sasl.jaas.config={jaas_plain}",
            f"ssl.keystore.location={self.keystore}",
            "ssl.keystore.type=PKCS12",
            f"ssl.keystore.password={self.store_password}",
            f"ssl.key.password={self.store_password}",
            f"ssl.truststore.location={self.ca}",
            "ssl.truststore.type=PEM",
            "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            f"super.users=User:{ADMIN}",
            "allow.everyone.if.no.acl.found=false",
        ]

    def format_args(self) -> list[str]:
        """kafka-storage format arguments that write the admin's SCRAM credential."""
        return ["--add-scram", f"{MECHANISM}=[name={ADMIN},password={self.admin_password}]"]

    def add_user(self, bootstrap: str, user: str, password: str, timeout_s: float = 30.0) -> None:
        """Create (or reset) ``user``'s SCRAM-SHA-512 credential, as the admin."""
        from confluent_kafka.admin import (  # type: ignore[attr-defined]
            ScramCredentialInfo,
            ScramMechanism,
            UserScramCredentialUpsertion,
        )

        from stream.kafka.topics import admin

        client = admin(bootstrap, **self.admin_config())  # kept: its futures fail once it is gone
        upsert = UserScramCredentialUpsertion(user, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192),
                                              password.encode())
        for future in client.alter_user_scram_credentials([upsert]).values():
            future.result(timeout=timeout_s)


def make_security(root: Path) -> LocalSecurity:
    """A key pair and self-signed certificate for 127.0.0.1 in ``root`` (private to this user), and passwords."""
    keytool = shutil.which("keytool")
    if keytool is None:
        raise BrokerError("keytool (from the JDK) is needed to make the local cluster's TLS certificate")
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o700)
    security = LocalSecurity(root, secrets.token_urlsafe(18), secrets.token_urlsafe(18))
    for args in (
        ["-genkeypair", "-alias", "broker", "-keyalg", "RSA", "-keysize", "2048", "-validity", "30",
         "-dname", "CN=localhost", "-ext", "SAN=ip:127.0.0.1,dns:localhost", "-storetype", "PKCS12",
         "-keystore", str(security.keystore), "-storepass", security.store_password,
         "-keypass", security.store_password],
        ["-exportcert", "-rfc", "-alias", "broker", "-keystore", str(security.keystore),
         "-storepass", security.store_password, "-file", str(security.ca)],
    ):
        done = subprocess.run([keytool, *args], capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise BrokerError(f"keytool failed: {(done.stderr or done.stdout).strip()[-500:]}")
    return security
