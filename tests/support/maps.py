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
    "levels": st.sampled_from(["_/room/type", "a", "_/type", "type/a/b"]),
    "format": st.sampled_from(["json", "msgpack", "value"]),
    "ts": st.sampled_from(["t", "a.b", "value"]),
    "ts_unit": st.sampled_from(["s", "ms", "us", "ns", "iso8601"]),
    "type": st.sampled_from(["T", "U"]),
    "rename": st.dictionaries(st.sampled_from(["a", "value", "a.b"]), st.sampled_from(
        ["x", "y", "value"]), max_size=2),
    "id": st.sampled_from(["seq", "id"])})


def toml_of(rules) -> str:
    """The TOML text of a list of map rules (dicts)."""
    def lit(v):
        return "{ " + ", ".join(f"{json.dumps(k)} = {lit(x)}" for k, x in v.items()) + " }" \
            if isinstance(v, dict) else json.dumps(v)
    return "\n".join("[[topic]]\n" + "\n".join(f"{k} = {lit(v)}" for k, v in r.items())
                     for r in rules)
