"""Random device maps (Hypothesis strategies of map rules and of the JSON values
devices send) and the TOML text of a list of rules."""
import json

from hypothesis import strategies as st

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["value", "t", "id", "ts", "type", "a", "a_b", "seq"]) | st.text(
            max_size=3), inner, max_size=4), max_leaves=12)
rule_values = st.fixed_dictionaries({"filter": st.sampled_from(["s/+/+", "s/#", "#", "x"])}, optional={
    "levels": st.sampled_from(["_/room/type", "a", "_/type", "type/a/b", "_/{room}1/type",
                               "{a}-{b}/_/{type}"]),
    "format": st.sampled_from(["json", "msgpack", "value"]),
    "ts": st.sampled_from(["t", "a.b", "value"]),
    "ts_unit": st.sampled_from(["s", "ms", "us", "ns", "iso8601"]),
    "type": st.sampled_from(["T", "U"]),
    "rename": st.dictionaries(st.sampled_from(["a", "value", "a.b"]), st.sampled_from(
        ["x", "y", "value"]), max_size=2),
    "id": st.sampled_from(["seq", "id"]),
    # by content (issue 53): conditions, attributes from fields, names, event tables
    "when": st.dictionaries(st.sampled_from(["a", "t", "a.b", "type"]),
                            st.sampled_from([1, 1.5, "x", True, "T"]), max_size=2),
    "has": st.lists(st.sampled_from(["a", "t", "a.b", "value", "0"]), max_size=2),
    "attrs": st.dictionaries(st.sampled_from(["x", "y", "value"]),
                             st.sampled_from(["a", "t", "a.b", "0.a"]), max_size=2),
    "names": st.sampled_from(["keep", "clean"]),
    "event": st.lists(st.fixed_dictionaries({}, optional={
        "type": st.sampled_from(["T", "U"]), "from": st.sampled_from(["a", "a.b", "0", "t"]),
        "when": st.dictionaries(st.sampled_from(["a", "t"]), st.sampled_from([1, "x"]),
                                max_size=1),
        "has": st.lists(st.sampled_from(["a", "value"]), max_size=1),
        "attrs": st.dictionaries(st.sampled_from(["z"]), st.sampled_from(["t", "a"]),
                                 max_size=1),
        "rename": st.dictionaries(st.sampled_from(["b", "value"]), st.sampled_from(["w"]),
                                  max_size=1)}), max_size=3)})


def toml_of(rules) -> str:
    """The TOML text of a list of map rules (dicts)."""
    def lit(v):
        if isinstance(v, dict):
            return "{ " + ", ".join(f"{json.dumps(k)} = {lit(x)}" for k, x in v.items()) + " }"
        if isinstance(v, list):
            return "[ " + ", ".join(lit(x) for x in v) + " ]"
        return "true" if v is True else "false" if v is False else json.dumps(v)
    return "\n".join("[[topic]]\n" + "\n".join(f"{k} = {lit(v)}" for k, v in r.items())
                     for r in rules)
