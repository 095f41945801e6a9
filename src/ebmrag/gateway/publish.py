"""The producer side: put result messages (JSON or HL7 v2 ORU^R01) on the gateway's stream."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ebmrag.errors import require_extra
from ebmrag.gateway.consumer import STREAM
from ebmrag.store.results import MessageError, ResultMessage, messages_from_hl7, parse_messages


def publish(broker: str, messages: Sequence[ResultMessage], stream: str = STREAM) -> list[str]:
    """XADD each message (validated first: nothing is sent when one is invalid); returns the entry ids."""
    redis = require_extra("redis", "gateway", "publishing results")
    client = redis.Redis.from_url(broker, decode_responses=True)
    with client.pipeline(transaction=False) as pipe:
        for message in messages:
            pipe.xadd(stream, {"message": message.model_dump_json()})
        return [str(entry) for entry in pipe.execute()]


def read_messages(path: Path, tenant: str = "", producer: str = "hl7") -> list[ResultMessage]:
    """A JSON message, a JSON list of them, or an HL7 v2 file (which needs `tenant`)."""
    text = path.read_text(encoding="utf-8")
    if text.lstrip().startswith("MSH"):
        if not tenant:
            raise MessageError(f"{path}: an HL7 file needs --tenant (HL7 does not carry one)")
        return messages_from_hl7(text, tenant, producer)
    return parse_messages(text, str(path))  # bounded: a file nested 10^5 deep is an error, not a traceback
