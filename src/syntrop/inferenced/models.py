"""The other daemons inferenced asks about models: modeld for what it
stores, runtimed for an answer (StreamInference)."""

import logging
from collections.abc import AsyncIterator

from syntrop.config import Paths

logger = logging.getLogger(__name__)

#: Seconds modeld may take to list its models.
MODELD_TIMEOUT = 5.0


class Unavailable(Exception):
    """runtimed cannot be reached or did not answer; the reason."""


async def stored(paths: Paths) -> dict[str, int]:
    """What modeld stores: name (and name:tag for tags other than
    latest) → bytes of its weights; {} when modeld cannot be reached."""
    from syntrop.interfaces.model import Model1
    from syntrop.varlink.client import connect

    try:
        async with await connect(Model1, address=paths.socket(Model1.name),
                                 timeout=MODELD_TIMEOUT) as modeld:
            listed = (await modeld.List())["models"]
    except Exception as error:  # modeld is optional to inferenced
        logger.info("modeld's models unknown: %s", error)
        return {}
    found = {}
    for model in listed:
        found[f"{model.name}:{model.tag}"] = model.size
        if model.tag == "latest":
            found[model.name] = model.size
    return found


async def complete(paths: Paths, model: str, prompt: str) -> AsyncIterator[str]:
    """The prompt as a user's message, through runtimed's Chat with the
    model's defaults: the answer's text as it comes. Unavailable when
    runtimed cannot be reached or fails."""
    from asyncvarlink import VarlinkErrorReply

    from syntrop.interfaces.runtime import ChatMessage, Runtime1
    from syntrop.varlink.client import CallTimeout, connect

    try:
        client = await connect(Runtime1, address=paths.socket(Runtime1.name))
    except (OSError, CallTimeout) as error:
        raise Unavailable(f"cannot reach runtimed: {error}") from None
    async with client:
        try:
            async for reply in client.Chat(
                    model=model, messages=[ChatMessage(role="user", content=prompt)]):
                yield reply["chunk"].text
        except VarlinkErrorReply as error:
            raise Unavailable(f"runtimed answered {error.name}") from None
        except (OSError, CallTimeout) as error:
            raise Unavailable(f"runtimed failed: {error}") from None
