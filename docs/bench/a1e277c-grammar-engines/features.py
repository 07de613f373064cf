"""Feature checks for xgrammar vs llguidance (transformers-free construction)."""
import json, time, sys
import torch
from tokenizers import Tokenizer
import llguidance as llg
import llguidance.torch as llg_torch
import xgrammar as xgr

ns = time.perf_counter_ns
out = lambda s: print(s, flush=True)


def load(path):
    s = open(path, encoding="utf-8").read()
    hf = Tokenizer.from_str(s)
    vocab = hf.get_vocab(with_added_tokens=True)
    V = max(vocab.values()) + 1
    enc = [""] * V
    for k, i in vocab.items():
        enc[i] = k
    stops = [i for i in (hf.token_to_id("<|im_end|>"), hf.token_to_id("<|endoftext|>")) if i is not None]
    meta = xgr.TokenizerInfo._detect_metadata_from_hf(s)
    xinfo = xgr.TokenizerInfo(enc, meta["vocab_type"], vocab_size=V, stop_token_ids=stops,
                              add_prefix_space=meta["add_prefix_space"])
    ltok = llg.LLTokenizer(s, eos_token=stops)
    return hf, xinfo, ltok, stops


class XE:
    name = "xgrammar"

    def __init__(s, info, stops):
        s.c = xgr.GrammarCompiler(info, max_threads=2)
        s.eos = stops[0]
        s.V = info.vocab_size

    def build(s, kind, src):
        if kind == "schema":
            return s.c.compile_json_schema(json.dumps(src))
        if kind == "regex":
            return s.c.compile_regex(src)
        if kind == "ebnf":
            return s.c.compile_grammar(src)
        if kind == "lark":
            return s.c.compile_lark(src)
        if kind == "choice":
            return s.c.compile_grammar("root ::= " + " | ".join(json.dumps(x) for x in src))
        if kind == "stag":
            return s.c.compile_structural_tag(src)
        raise ValueError(kind)

    def matcher(s, cg):
        return xgr.GrammarMatcher(cg)

    def feed(s, m, toks):
        for t in toks:
            if not m.accept_token(t):
                return False
        return True

    def accepts(s, cg, toks):
        m = s.matcher(cg)
        return s.feed(m, toks) and m.accept_token(s.eos)

    def mask(s, m):
        bm = xgr.allocate_token_bitmask(1, s.V)
        m.fill_next_token_bitmask(bm)
        return bm.clone()

    def rollback(s, m, k):
        m.rollback(k)

    def fork(s, m):
        return m.fork()


class LE:
    name = "llguidance"

    def __init__(s, tok, stops):
        s.tok = tok
        s.eos = stops[0]
        s.V = tok.vocab_size

    def build(s, kind, src):
        if kind == "schema":
            g = llg.LLMatcher.grammar_from_json_schema(src)
        elif kind == "regex":
            g = llg.grammar_from("regex", src)
        elif kind == "ebnf":
            g = llg.grammar_from("gbnf", src)
        elif kind == "lark":
            g = llg.grammar_from("lark", src)
        elif kind == "choice":
            g = llg.grammar_from("choice", json.dumps(src))
        else:
            raise ValueError(kind)
        err = llg.LLMatcher.validate_grammar(g, s.tok)
        if err and not err.startswith("WARNING"):
            raise RuntimeError(err)
        return g

    def matcher(s, g):
        m = llg.LLMatcher(s.tok, g, log_level=0)
        if m.is_error():
            raise RuntimeError(m.get_error())
        return m

    def feed(s, m, toks):
        return m.consume_tokens(toks)

    def accepts(s, g, toks):
        m = s.matcher(g)
        return s.feed(m, toks) and m.consume_token(s.eos) and not m.is_error()

    def mask(s, m):
        bm = llg_torch.allocate_token_bitmask(1, s.V)
        llg_torch.fill_next_token_bitmask(m, bm, 0)
        return bm.clone()

    def rollback(s, m, k):
        assert m.rollback(k)

    def fork(s, m):
        return m.deep_copy()


def check(E, hf, label, kind, src, valid, invalid):
    try:
        cg = E.build(kind, src)
    except Exception as e:
        out(f"  {E.name:<10s} {label:<34s} COMPILE ERROR: {str(e).splitlines()[0][:150]}")
        return
    tok = lambda x: hf.encode(x, add_special_tokens=False).ids
    v = [E.accepts(cg, tok(x)) for x in valid]
    iv = [E.accepts(cg, tok(x)) for x in invalid]
    verdict = "OK" if all(v) and not any(iv) else "MISMATCH"
    out(f"  {E.name:<10s} {label:<34s} {verdict:<8s} valid accepted {v}  invalid accepted {iv}")


J = json.dumps
CASES = [
    ("additionalProperties:false", {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"], "additionalProperties": False},
     [J({"a": "x"})], [J({"a": "x", "b": 1})]),
    ("no additionalProperties given", {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
     [J({"a": "x"})], [J({"a": "x", "b": 1})]),  # 'invalid' only under strict semantics
    ("required", {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer"}}, "required": ["a", "b"], "additionalProperties": False},
     [J({"a": "x", "b": 2})], [J({"a": "x"})]),
    ("enum", {"type": "string", "enum": ["red", "green", "blue"]}, [J("green")], [J("pink")]),
    ("const", {"type": "object", "properties": {"v": {"const": "v1"}}, "required": ["v"]}, [J({"v": "v1"})], [J({"v": "v2"})]),
    ("pattern", {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"}, [J("ABC-12")], [J("abc-12"), J("ABC-123")]),
    ("minItems/maxItems", {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 3}, ["[1, 2]", "[1, 2, 3]"], ["[1]", "[1, 2, 3, 4]"]),
    ("anyOf", {"anyOf": [{"type": "integer"}, {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"], "additionalProperties": False}]},
     ["5", J({"x": "a"})], [J("s")]),
    ("oneOf", {"oneOf": [{"type": "integer"}, {"type": "boolean"}]}, ["5", "true"], [J("s")]),
    ("$ref/$defs", {"$defs": {"pt": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"], "additionalProperties": False}},
                    "type": "object", "properties": {"p": {"$ref": "#/$defs/pt"}}, "required": ["p"], "additionalProperties": False},
     [J({"p": {"x": 1}})], [J({"p": {"y": 1}})]),
    ("recursive $ref", {"$defs": {"n": {"type": "object", "properties": {"v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/n"}}}, "required": ["v"], "additionalProperties": False}},
                        "$ref": "#/$defs/n"},
     [J({"v": 1, "kids": [{"v": 2, "kids": [{"v": 3}]}]})], [J({"v": 1, "kids": [{"w": 2}]})]),
    ("integer minimum/maximum", {"type": "integer", "minimum": 1, "maximum": 10}, ["1", "10"], ["0", "11"]),
    ("number minimum/maximum", {"type": "number", "minimum": 0, "maximum": 2}, ["1.5", "0"], ["2.5", "-1"]),
    ("string minLength/maxLength", {"type": "string", "minLength": 2, "maxLength": 4}, [J("ab"), J("abcd")], [J("a"), J("abcde")]),
    ("format: date-time", {"type": "string", "format": "date-time"}, [J("2024-01-02T03:04:05Z")], [J("yesterday")]),
    ("format: email", {"type": "string", "format": "email"}, [J("a@b.com")], [J("not an email")]),
    ("uniqueItems", {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, ["[1, 2]"], ["[1, 1]"]),
    ("multipleOf", {"type": "integer", "multipleOf": 5}, ["10"], ["7"]),
]

TOOL_LARK = r'''
start: "<tool_call>\n<function=get_weather>\n" p_city p_days "</function>\n</tool_call>"
p_city: "<parameter=city>\n" CITY "\n</parameter>\n"
p_days: "<parameter=days>\n" days_val "\n</parameter>\n"
days_val: %json {"type": "integer", "minimum": 1, "maximum": 14}
CITY: /[^<\n]+/
'''
# same grammar, but <tool_call>/</tool_call> referenced as (added/special) TOKENS, not text
TOOL_LARK_TOK = TOOL_LARK.replace('"<tool_call>\\n', '<tool_call> "\\n').replace('</tool_call>"', '" </tool_call>')
TOOL_EBNF = r'''
root ::= "<tool_call>\n<function=get_weather>\n" p_city p_days "</function>\n</tool_call>"
p_city ::= "<parameter=city>\n" [^<\n]+ "\n</parameter>\n"
p_days ::= "<parameter=days>\n" ("-"? ("0" | [1-9] [0-9]*)) "\n</parameter>\n"
'''
TOOL_VALID = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"
TOOL_INVALID = [TOOL_VALID.replace("\n3\n", "\nthree\n"),
                TOOL_VALID.replace("<parameter=days>\n3\n</parameter>\n", ""),
                TOOL_VALID.replace("get_weather", "get_time")]
TOOL_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1, "maximum": 14}},
               "required": ["city", "days"], "additionalProperties": False}


def rollback_fork(E, hf, cg):
    toks = hf.encode(J({"query": "weather in paris today please", "max_results": 5, "mode": "fast"}), add_special_tokens=False).ids
    m = E.matcher(cg)
    assert E.feed(m, toks[:10])
    mask10 = E.mask(m)
    ref = E.matcher(cg); E.feed(ref, toks[:6]); mask6 = E.mask(ref)
    t = ns(); E.rollback(m, 4); t_rb = ns() - t
    ok_rb = torch.equal(E.mask(m), mask6)
    ok_refeed = E.feed(m, toks[6:]) and (m.accept_token(E.eos) if E.name == "xgrammar" else m.consume_token(E.eos))
    # fork at position 10
    m2 = E.matcher(cg); E.feed(m2, toks[:10])
    t = ns(); f = E.fork(m2); t_fork = ns() - t
    ok_fork = E.feed(f, toks[10:]) and torch.equal(E.mask(m2), mask10)
    # reject a bad draft token then roll back
    m3 = E.matcher(cg); E.feed(m3, toks[:5])
    out(f"  {E.name:<10s} rollback(4): state==fresh@6 {ok_rb}, re-feed+EOS ok {ok_refeed}, {t_rb/1e3:.1f} us | "
        f"fork/deep_copy: independent {ok_fork}, {t_fork/1e3:.1f} us")


def main():
    hf, xinfo, ltok, stops = load("/work/main/tfd/assets/demo_tokenizer.json")
    X, L = XE(xinfo, stops), LE(ltok, stops)
    out("== JSON Schema features (demo4k tokenizer; valid/invalid fed as real tokens + EOS)")
    for label, sch, val, inv in CASES:
        for E in (X, L):
            check(E, hf, label, "schema", sch, val, inv)
    out("== regex / choice / grammars")
    for E in (X, L):
        check(E, hf, "regex \\d{3}-[a-z]+", "regex", r"\d{3}-[a-z]+", ["123-abc"], ["12-abc", "123-ABC"])
        check(E, hf, "choice yes|no|maybe", "choice", ["yes", "no", "maybe"], ["yes", "maybe"], ["y", "yesno", "perhaps"])
        check(E, hf, "GBNF/EBNF  a+ b", "ebnf", 'root ::= "a"+ "b"', ["aab"], ["b", "aa"])
        check(E, hf, "Lark  a+ b", "lark", 'start: "a"+ "b"', ["aab"], ["b", "aa"])
    out("== Qwen-style XML tool call (big150k tokenizer: <tool_call> is one added token)")
    hf2, xinfo2, ltok2, stops2 = load("/tmp/gram/big_tokenizer.json")
    tc_id = hf2.token_to_id("<tool_call>")
    out(f"  sample tokens start: {hf2.encode(TOOL_VALID, add_special_tokens=False).ids[:4]} (<tool_call> id {tc_id}); "
        f"xgrammar special_token_ids={xinfo2.special_token_ids[:10]}")
    X2, L2 = XE(xinfo2, stops2), LE(ltok2, stops2)
    out("  Lark (token form):" + repr(TOOL_LARK_TOK))
    for E in (X2, L2):
        check(E, hf2, "Lark text-literal <tool_call> + %json", "lark", TOOL_LARK, [TOOL_VALID], TOOL_INVALID)
        check(E, hf2, "Lark token <tool_call> + %json", "lark", TOOL_LARK_TOK, [TOOL_VALID], TOOL_INVALID)
    TOOL_EBNF_TOK = TOOL_EBNF.replace('"<tool_call>\\n', '<tool_call> "\\n').replace('</tool_call>"', '" </tool_call>')
    for E in (X2, L2):
        check(E, hf2, "GBNF text-literal <tool_call>", "ebnf", TOOL_EBNF, [TOOL_VALID], TOOL_INVALID)
        check(E, hf2, "GBNF token <tool_call>", "ebnf", TOOL_EBNF_TOK, [TOOL_VALID], TOOL_INVALID)
    # xgrammar builtin: Qwen3.5 XML structural tag, forced tool, no reasoning
    try:
        stag = xgr.get_model_structural_tag(
            "qwen_3_5", tools=[{"type": "function", "function": {"name": "get_weather", "parameters": TOOL_SCHEMA}}],
            tool_choice={"type": "function", "function": {"name": "get_weather"}}, reasoning="disabled")
        check(X2, hf2, "builtin qwen_3_5 structural tag", "stag", stag, [TOOL_VALID], TOOL_INVALID)
    except Exception as e:
        out(f"  xgrammar builtin qwen_3_5 structural tag: ERROR {e}")
    out("== rollback / fork (typical schema, demo4k)")
    sch = {"type": "object", "properties": {"query": {"type": "string"}, "max_results": {"type": "integer"},
           "mode": {"type": "string", "enum": ["fast", "slow"]}}, "required": ["query"], "additionalProperties": False}
    rollback_fork(X, hf, X.build("schema", sch))
    rollback_fork(L, hf, L.build("schema", sch))


if __name__ == "__main__":
    main()
