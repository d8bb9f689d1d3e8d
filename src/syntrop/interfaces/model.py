"""io.syntrop.Model1: the content-addressed model store (modeld)."""

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TypedDict

from asyncvarlink import FileDescriptor, TypedVarlinkErrorReply

from syntrop.interfaces import names
from syntrop.varlink.authz import not_authorized
from syntrop.varlink.contract import Interface, method

NAME = names.MODEL


@dataclass(frozen=True, slots=True, kw_only=True)
class Model:
    """A model in the store.

    Fields:
        name: Model name, e.g. smollm2-135m-instruct.
        tag: Tag, e.g. latest or q4_1.
        digest: SHA-256 of the weights, hex, as stored.
        size: Bytes of the weights.
        format: File format, e.g. gguf.
        architecture: Architecture read from the file's metadata, e.g. llama.
        quantization: Quantization read from the file's metadata, e.g. Q4_1.
        license: License named in the file's metadata, if any.
        pinned: Pinned models are never pruned.
        last_access_usec: Last time the model was opened, microseconds since
            the epoch (CLOCK_REALTIME).
        source: Where the model came from (a pull reference or local path).
    """

    name: str
    tag: str
    digest: str
    size: int
    format: str
    architecture: str | None
    quantization: str | None
    license: str | None
    pinned: bool
    last_access_usec: int
    source: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class PullProgress:
    """One step of a pull.

    Fields:
        phase: waiting (another pull of the same blob runs first), receiving
            (the first such reply asks for the bytes from completed_bytes on;
            later ones report how far the store is), verifying, or done.
        completed_bytes: Bytes received and hashed so far, resumed bytes included.
        total_bytes: Bytes expected; null while unknown.
        digest: The expected SHA-256.
    """

    phase: str
    completed_bytes: int
    total_bytes: int | None
    digest: str | None


class PullReply(TypedDict):
    progress: PullProgress
    model: Model | None


class PruneResult(TypedDict):
    freed_bytes: int
    removed: list[str]
    remaining_bytes: int


class OpenModelResult(TypedDict):
    fd: FileDescriptor
    digest: str
    size: int


class InvalidIdentifier(TypedVarlinkErrorReply, interface=NAME):
    """A name or tag is empty, too long, '.' or '..', or contains '/', NUL or
    control characters. Nothing was touched.

    Parameters:
        identifier: The rejected identifier.
    """

    class Parameters:
        identifier: str


class ModelNotFound(TypedVarlinkErrorReply, interface=NAME):
    """No model has this name.

    Parameters:
        name: The name asked for.
    """

    class Parameters:
        name: str


class DigestMismatch(TypedVarlinkErrorReply, interface=NAME):
    """The bytes do not hash to the expected SHA-256; nothing was stored.

    Parameters:
        expected: The SHA-256 the bytes should have had.
        actual: The SHA-256 they had.
    """

    class Parameters:
        expected: str
        actual: str


class StoreFull(TypedVarlinkErrorReply, interface=NAME):
    """Not enough free space; refused before writing anything.

    Parameters:
        required: Bytes needed.
        available: Bytes free.
    """

    class Parameters:
        required: int
        available: int


class ModelInUse(TypedVarlinkErrorReply, interface=NAME):
    """The model is open (an fd handed out, a runtimed session) and cannot be
    removed now.

    Parameters:
        name: The model.
    """

    class Parameters:
        name: str


class InvalidReference(TypedVarlinkErrorReply, interface=NAME):
    """A pull reference that is not hf://, ollama://, https:// or a path.

    Parameters:
        reference: The reference given.
        reason: What is wrong with it.
    """

    class Parameters:
        reference: str
        reason: str


class PullFailed(TypedVarlinkErrorReply, interface=NAME):
    """The bytes of a pull did not arrive whole: the stream ended early (the
    partial is kept, and the next pull of the same digest resumes it), or
    brought more than announced (discarded).

    Parameters:
        reference: The reference pulled.
        status: HTTP status, 0 when the connection failed.
        reason: What went wrong, in words.
    """

    class Parameters:
        reference: str
        status: int
        reason: str


class InvalidModel(TypedVarlinkErrorReply, interface=NAME):
    """The bytes are not a model file the store accepts (GGUF versions 2 and
    3, safetensors), or its header is damaged; nothing was stored.

    Parameters:
        reason: What is wrong, in words.
    """

    class Parameters:
        reason: str


NotAuthorized = not_authorized(NAME)


class Model1(Interface, name=NAME):
    """Content-addressed model store: blobs by SHA-256, atomic verified
    staging, dedup, pins and pruning, pulls from registries."""

    errors = (
        InvalidIdentifier,
        ModelNotFound,
        DigestMismatch,
        StoreFull,
        ModelInUse,
        InvalidReference,
        PullFailed,
        InvalidModel,
        NotAuthorized,
    )

    @method(return_parameter="model")
    def Register(
        self,
        *,
        name: str,
        path: str | None = None,
        fd: FileDescriptor | None = None,
        sha256: str | None = None,
        pin: bool | None = None,
        source: str | None = None,
    ) -> Model:
        """Store a model from a local path or a passed file descriptor of a
        regular file: reflinked where the filesystem can, else copied in the
        kernel, hashed in the store, linked into place only when verified,
        never stored twice. Then tell routerd (Router1.Reload). Root and
        modeld's own user only.

        Parameters:
            name: name[:tag]; the spelling name:pinned pins it.
            path: An absolute path of a file readable by modeld.
            fd: Index of a passed file descriptor to read the weights from.
            sha256: Expected digest; the import fails if the bytes differ.
            pin: Pin the model against pruning; null keeps an existing pin.
            source: Where the bytes came from, recorded as the model's source
                (default: the path, or null for a descriptor).

        Returns:
            model: The stored model.
        """

    @method
    def Pull(
        self,
        *,
        reference: str,
        name: str | None = None,
        sha256: str | None = None,
        size: int | None = None,
        fd: FileDescriptor | None = None,
        restart: bool | None = None,
    ) -> AsyncIterator[PullReply]:
        """Receive a model that the caller fetches from a registry (modeld
        has no network; `syn pull` resolves the reference and feeds the
        bytes), hashing in flight into a journaled partial, then register
        it. Call with "more". The first reply in phase receiving says from
        which byte to send (a resumed partial); a reply in phase done without
        any receiving means the blob was stored already and nothing is to be
        sent. The stream ends with the registered model, or DigestMismatch,
        PullFailed (incomplete: the partial is kept), StoreFull (before any
        byte), InvalidModel. Root and modeld's own user only.

        Parameters:
            reference: hf://org/repo[@revision]/file.gguf,
                ollama://[registry/]namespace/model:tag, https://… or a path;
                recorded as the model's source.
            name: name[:tag] to store it as; derived from the reference when null.
            sha256: The SHA-256 the registry gives for the bytes (required).
            size: Bytes the registry announced; free space is checked against
                it before any byte is accepted.
            fd: Index of a passed file descriptor (the read end of a pipe) the
                bytes arrive on (required unless the blob is stored already).
            restart: Discard a partial kept from an earlier pull and start
                from byte 0 (for servers that ignore Range).

        Returns:
            progress: How far the pull is.
            model: The registered model, in the last reply only.
        """

    @method(return_parameter="models")
    def List(self) -> list[Model]:
        """List the stored models.

        Returns:
            models: Every model, by name.
        """

    @method(return_parameter="model")
    def Show(self, *, name: str) -> Model:
        """Describe one model.

        Parameters:
            name: name[:tag].

        Returns:
            model: The model.
        """

    @method
    def Remove(self, *, name: str) -> None:
        """Remove a model's name; its blob goes when no name uses it.
        Refused with ModelInUse while a descriptor from OpenModel of its blob
        is open and no other name uses that blob. Root and modeld's own user
        only.

        Parameters:
            name: name[:tag].
        """

    @method
    def Pin(self, *, name: str) -> None:
        """Protect a model from pruning. Root and modeld's own user only.

        Parameters:
            name: name[:tag].
        """

    @method
    def Unpin(self, *, name: str) -> None:
        """Let a model be pruned again. Root and modeld's own user only.

        Parameters:
            name: name[:tag].
        """

    @method
    def Prune(self, *, budget_bytes: int | None = None, dry_run: bool | None = None) -> PruneResult:
        """Remove least recently used models until the store fits its disk
        budget; never a pinned model, never one in use. Root and modeld's own
        user only.

        Parameters:
            budget_bytes: The budget to fit; the configured one when null.
            dry_run: Only report what would be removed.

        Returns:
            freed_bytes: Bytes freed (or that would be).
            removed: name:tag of each removed model.
            remaining_bytes: Bytes the store holds afterwards.
        """

    @method
    def OpenModel(self, *, name: str) -> OpenModelResult:
        """Open a model's verified blob read-only and pass the descriptor, so a
        sandboxed reader needs no access to the store. The blob counts as in
        use (not pruned, not removed) until the last copy of this
        descriptor is closed: keep it open while the model is loaded.
        Root, modeld's own user (the suite's) and whom polkit grants
        io.syntrop.model.read only.

        Parameters:
            name: name[:tag].

        Returns:
            fd: Index of the passed O_RDONLY file descriptor.
            digest: SHA-256 of the blob.
            size: Bytes.
        """
