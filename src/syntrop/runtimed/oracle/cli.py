"""`runtimed verify MODEL`: check llama.cpp's logits on a model against the
numpy oracle; exit 0 when they agree, 1 when they do not, 2 when the model
cannot be checked. MODEL is a GGUF file, or a model's name in modeld: then
the bytes come as modeld's descriptor (Model1.OpenModel over its socket),
are hashed against the digest modeld reports, and are read through
/proc/self/fd/N, as runtimed reads them."""

import argparse
import asyncio
import os
import sys
from dataclasses import replace
from pathlib import Path


def _from_modeld(name: str) -> tuple[int, str]:
    """modeld's descriptor of `name` (the caller closes it), or an error
    message for the user."""
    from syntrop.config import paths
    from syntrop.interfaces import model as contract
    from syntrop.runtimed.models import open_in_modeld
    from syntrop.runtimed.models import sha256_of as sha256

    try:
        fd, digest, _ = asyncio.run(open_in_modeld(paths().socket(contract.Model1.name), name,
                                                   30.0))
    except (contract.ModelNotFound, contract.InvalidIdentifier):
        raise LookupError(f"{name}: no such file, and modeld has no model of that name") \
            from None
    except OSError as error:
        raise LookupError(f"{name}: no such file, and modeld cannot be reached "
                          f"({error.strerror or error})") from None
    actual = sha256(fd)
    if actual != digest:
        os.close(fd)
        raise LookupError(f"{name}: the bytes modeld handed over hash to {actual}, "
                          f"not {digest}")
    return fd, digest


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="runtimed verify",
        description="Check llama.cpp's logits on a llama-architecture GGUF file against "
                    "a numpy forward pass (see syntrop.runtimed.oracle).")
    parser.add_argument("model", type=Path,
                        help="the GGUF file, or a model's name in modeld")
    parser.add_argument("--tokens", type=int, default=16, metavar="N",
                        help="check the first N tokens of a fixed text (default 16)")
    parser.add_argument("--all-tokens", action="store_true",
                        help="check a sequence of every token id of the vocabulary "
                             "(small vocabularies only)")
    parser.add_argument("--tolerance", type=float, default=None,
                        help="largest relative error allowed (default: calibrated)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("-v", "--verbose", action="store_true", help="one line per position")
    args = parser.parse_args(argv)
    if args.tokens < 1:
        parser.error("--tokens must be at least 1")
    fd = None
    args.name = str(args.model)
    if not args.model.is_file():
        if len(args.model.parts) != 1:
            print(f"runtimed verify: {args.model}: no such file", file=sys.stderr)
            return 2
        try:
            fd, digest = _from_modeld(str(args.model))
        except LookupError as error:
            print(f"runtimed verify: {error}", file=sys.stderr)
            return 2
        print(f"{args.model}: modeld's sha256:{digest}")
        args.model = Path(f"/proc/self/fd/{fd}")
    try:
        return _check(args)
    finally:
        if fd is not None:
            os.close(fd)


def _check(args: argparse.Namespace) -> int:
    from syntrop.runtimed.oracle.compare import format_report, verify
    from syntrop.runtimed.oracle.weights import OracleError, Weights

    try:
        tokens = None
        if args.all_tokens:
            n_vocab = Weights(args.model).config.n_vocab
            if n_vocab > 4096:
                print(f"runtimed verify: {n_vocab} tokens is too many for --all-tokens",
                      file=sys.stderr)
                return 2
            tokens = list(range(n_vocab))
        report = verify(args.model, tokens, count=args.tokens, tolerance=args.tolerance,
                        threads=args.threads)
    except (OracleError, ValueError) as error:
        print(f"runtimed verify: {args.name}: {error}", file=sys.stderr)
        return 2
    print(format_report(replace(report, path=args.name), verbose=args.verbose))
    return 0 if report.ok else 1
