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


def test_the_newest_matches_carry_their_return_values_and_a_readable_time(tmp_path):
    """/status's last matches (and the page's): the detection time as people read it
    beside the ms, and with --returns the RETURN values by name."""
    from dqcep.io.journal import Journal
    from tests.support.journal_service import config, finish
    (tmp_path / "q.cep").write_text("QUERY hot PATTERN Temperature t WHERE t.tC > 30 "
                                    "WITHIN 1 s RETURN t.device, t.tC")
    journal = Journal(tmp_path / "journal", fsync="never")
    journal.append("ht-1/events/rpc", json.dumps(shelly({"temperature:0": {"tC": 31.5}})
                                                 ).encode(), ARRIVAL_US, None)
    journal.commit()
    journal.close()
    svc = finish(config(tmp_path, fmt=None, queries=tmp_path / "q.cep", returns=True,
                        last_matches=True, topic_map=TopicMap.parse(SHELLY), tick=0))
    (newest,) = svc.last_matches
    assert newest["detected_at"] == 1700000000250
    assert newest["detected"] == "2023-11-14T22:13:20.250Z"
    assert newest["return"] == {"t.device": "ht-1", "t.tC": 31.5}


def test_a_running_service_says_it_once_after_its_first_events(tmp_path, capsys,
                                                                monkeypatch):
    """Before the stream ends: once UNSEEN_AFTER events have come (3 here), once."""
    from dqcep.io.journal import Journal
    from dqcep.service import consumer
    from tests.support.journal_service import config, run_once
    monkeypatch.setattr(consumer, "UNSEEN_AFTER", 3)
    (tmp_path / "q.cep").write_text("QUERY hot PATTERN Temperature t WHERE t.tc > 30 "
                                    "WITHIN 1 s")
    journal = Journal(tmp_path / "journal", fsync="never")
    for _ in range(5):
        journal.append("ht-1/events/rpc", json.dumps(shelly({"temperature:0": {"tC": 31}})
                                                     ).encode(), ARRIVAL_US, None)
        journal.commit()
    journal.close()
    run_once(config(tmp_path, fmt=None, queries=tmp_path / "q.cep",
                    topic_map=TopicMap.parse(SHELLY), tick=0))  # no end of stream
    err = capsys.readouterr().err
    assert err.count("never appeared") == 1 and "attribute 'tc'" in err, err
