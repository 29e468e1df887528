"""A guide as xgrammar compiles it: the one place a ``Guide`` becomes a ``CompiledGrammar``, in
the scheduler's process and in a compile worker's (``engine/guided/compile_worker.py``) alike."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import orjson

from engine.request.guide import Guide

if TYPE_CHECKING:  # xgrammar loads on the first guided request, not before
    import xgrammar as xgr

    from engine.model.tokenizer import Tokenizer

_ORIGIN = re.compile(r"^\[[\d:]+\] \S+:\d+: ")  # xgrammar's "[hh:mm:ss] file.cc:line: "


class CompileError(ValueError):
    """A guide that does not compile, or not within the time limit (``outcome``)."""

    def __init__(self, message: str, outcome: str) -> None:
        super().__init__(message)
        self.outcome = outcome


def token_info(tokenizer: Tokenizer, vocab_size: int) -> xgr.TokenizerInfo:
    """xgrammar's view of the vocabulary: its own reading of the tokenizer (byte-level, byte
    fallback or raw) over the logits' width (ids past the tokenizer's are never allowed), with
    the model's stop tokens as the ones that end a finished grammar."""
    import xgrammar as xgr
    from transformers import PreTrainedTokenizerFast

    wrapped = PreTrainedTokenizerFast(tokenizer_object=tokenizer.backend)
    return xgr.TokenizerInfo.from_huggingface(
        wrapped, vocab_size=vocab_size, stop_token_ids=sorted(tokenizer.stop_ids)
    )


def compile_guide(compiler: xgr.GrammarCompiler, guide: Guide) -> xgr.CompiledGrammar:
    """``guide`` compiled by ``compiler``; a CompileError
    (``invalid``) in xgrammar's words, without its source location, when it does not compile."""
    import xgrammar as xgr

    try:
        match guide.kind:
            case "json_object":  # any JSON object, as OpenAI's json_object means
                return compiler.compile_json_schema(
                    '{"type": "object"}', strict_mode=False, any_whitespace=False
                )
            case "json_schema":
                return compiler.compile_json_schema(
                    guide.spec, strict_mode=guide.strict, any_whitespace=False
                )
            case "regex":
                return compiler.compile_regex(guide.spec)
            case "alternation":  # one grammar: any one of its parts
                parts = [grammar_of(p) for p in guide.parts]
                return compiler.compile_grammar(xgr.Grammar.union(*parts))
            case _:
                return compiler.compile_grammar(grammar_of(guide))
    except (RuntimeError, ValueError) as e:
        message = _ORIGIN.sub("", str(e).strip())
        raise CompileError(f"the {guide.kind} does not compile: {message}", "invalid") from None


def grammar_of(guide: Guide) -> xgr.Grammar:
    """``guide`` (not an alternation) as an xgrammar ``Grammar``, uncompiled: what an
    alternation unites."""
    import xgrammar as xgr

    match guide.kind:
        case "json_object":
            return xgr.Grammar.from_json_schema(
                '{"type": "object"}', strict_mode=False, any_whitespace=False
            )
        case "json_schema":
            return xgr.Grammar.from_json_schema(
                guide.spec, strict_mode=guide.strict, any_whitespace=False
            )
        case "regex":
            return xgr.Grammar.from_regex(guide.spec)
        case "tagged_json":
            return xgr.Grammar.from_ebnf(tagged_ebnf(guide))
        case "choice":
            options = orjson.loads(guide.spec)
            return xgr.Grammar.from_ebnf(
                "root ::= " + " | ".join(orjson.dumps(c).decode() for c in options)
            )
        case "grammar":
            return xgr.Grammar.from_ebnf(guide.spec)
    raise ValueError(f"a {guide.kind} guide is not one grammar")


def tagged_ebnf(guide: Guide) -> str:
    """A ``tagged_json`` guide's grammar: blocks of ``begin`` + JSON (held to ``schema``) +
    ``end``, one, or one or more a newline apart (``repeat``)."""
    import xgrammar as xgr

    spec = orjson.loads(guide.spec)
    inner = str(
        xgr.Grammar.from_json_schema(
            orjson.dumps(spec["schema"]).decode(), strict_mode=guide.strict, any_whitespace=False
        )
    )
    # the schema's start rule renamed; the others (root_...) are its own and keep their names
    inner = re.sub(r"^root ::=", "tagged_value ::=", inner, count=1, flags=re.MULTILINE)
    block = (
        f"{orjson.dumps(spec['begin']).decode()} tagged_value {orjson.dumps(spec['end']).decode()}"
    )
    more = ' ("\\n" tagged_block)*' if spec["repeat"] else ""
    return f"root ::= tagged_block{more}\ntagged_block ::= {block}\n{inner}"
