"""What the service says of its input once: the types and attributes its queries name
that no event held, and the attributes its map made that no query can name."""
import json

from dqcep.io.mapping import TopicMap
from tests.io.test_map_content import ARRIVAL_US, SHELLY, shelly


def test_the_service_says_once_what_its_queries_name_and_no_event_held(tmp_path, capsys):
    """A typo (t.tc for the Shelly's tC) gives no match and no error: the service says
    so, with the query's position, at the stream's end (or after UNSEEN_AFTER events),
    and says once which attribute of the map no query could name."""
    from dqcep.io.journal import Journal
    from tests.support.journal_service import config, finish
    (tmp_path / "q.cep").write_text("QUERY hot PATTERN Temperature t WHERE t.tc > 30 "
                                    "WITHIN 1 s")
    (tmp_path / "shelly.toml").write_text(SHELLY)
    journal = Journal(tmp_path / "journal", fsync="never")
    for k in range(3):
        journal.append("ht-1/events/rpc", json.dumps(shelly({"temperature:0": {"tC": 31}})
                                                     ).encode(), ARRIVAL_US, None)
        journal.append("ht-1/events/rpc", json.dumps(shelly({"temperature:0": {
            "tC": 31, "dew:pt": 2}})).encode(), ARRIVAL_US, None)
    journal.commit()
    journal.close()
    finish(config(tmp_path, fmt=None, queries=tmp_path / "q.cep",
                  topic_map=TopicMap.load(tmp_path / "shelly.toml"), tick=0))
    err = capsys.readouterr().err
    assert err.count("never appeared") == 1
    assert "q.cep:1:39: attribute 'tc' never appeared in the input (its first 6 events)" \
        in err, err
    assert err.count("'dew:pt'") == 1 and "names = \"clean\"" in err
