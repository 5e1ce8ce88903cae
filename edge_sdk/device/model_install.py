"""Installing the inference model the coordinator publishes: a copy of the installed one is only
acknowledged, a model is checked for who signed it (edge_sdk/signing.py) and written atomically
(edge_sdk/model_store.py); the answer is an `ack`, or an `error{bad_model}` saying why not."""

from __future__ import annotations

import hashlib
import logging

from edge_sdk.device.client_config import ClientConfig
from edge_sdk.model_store import ModelRejected, installed_issued_ms, installed_sha256, save_model
from edge_sdk.protocol.errors import ErrorCode
from edge_sdk.protocol.messages import Ack, Error, Model
from edge_sdk.signing import SignatureRejected, key_id, verify_model

__all__ = ["ModelInstaller"]

log = logging.getLogger("edge_sdk.client")  # the device's log, whichever part of it speaks


class ModelInstaller:
    """Installs the models published to one device (`ClientConfig.state_dir`, `trusted_keys`)."""

    def __init__(self, config: ClientConfig) -> None:
        for key in config.trusted_keys:
            key_id(key)  # a raw 32-byte Ed25519 public key, or a ValueError now rather than at the first model
        self.device_id, self.job = config.device_id, config.job
        self.state_dir, self.trusted_keys = config.state_dir, config.trusted_keys
        self.published: Model | None = None  # the latest model the coordinator published
        self._warned_unsigned = False  # said once that models are installed without checking who signed them

    def install(self, model: Model) -> Ack | Error:
        """Install ``model`` if its signature checks out; the answer to send the coordinator."""
        state_dir = self.state_dir
        claimed = bytes(model.sha256)
        if (state_dir is not None and claimed.hex() == installed_sha256(state_dir)
                and hashlib.sha256(model.data).digest() == claimed):
            # an intact copy of the installed model, e.g. the retained one the broker hands out on every connect
            self.published = model
            return Ack(f"model for round {model.round + 1} already installed")
        try:
            self._check_origin(model)
        except SignatureRejected as exc:
            log.error("%s: published model of round %d refused: %s", self.device_id, model.round + 1, exc)
            return Error(ErrorCode.BAD_MODEL, f"refused: {exc}"[:1000])
        self.published = model
        if state_dir is None:
            log.info("%s: model for %s (round %d) kept in memory: no state_dir to save it in",
                     self.device_id, model.label, model.round + 1)
            return Ack(f"model for round {model.round + 1} kept in memory")
        try:
            path = save_model(state_dir, model)
        except (ModelRejected, OSError) as exc:
            log.error("%s: published model refused: %s", self.device_id, exc)
            return Error(ErrorCode.BAD_MODEL, str(exc)[:1000])
        log.info("%s: installed the %s model of round %d (%s) at %s", self.device_id, model.label,
                 model.round + 1, f"signed by key {model.key_id}" if self.trusted_keys else "unchecked", path)
        return Ack(f"model for round {model.round + 1} installed")

    def _check_origin(self, model: Model) -> None:
        """Raise `SignatureRejected` unless a trusted key signed ``model`` for this device and job,
        no earlier than the model it has; without trusted keys, warn once and let it through."""
        if not self.trusted_keys:
            if not self._warned_unsigned:
                self._warned_unsigned = True
                log.warning("%s: installing published models without checking who signed them: no trusted "
                            "coordinator key; add its model-signing.pub as [security] trusted_keys in the "
                            "client config (docs/deploy.md, \"Signed models\")", self.device_id)
            return
        if self.state_dir is not None:
            not_before = installed_issued_ms(self.state_dir)
        else:
            not_before = self.published.issued_ms if self.published is not None else 0
        verify_model(model, self.trusted_keys, self.job, self.device_id, not_before)
