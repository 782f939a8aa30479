"""Which people a /keys/query answer settles, and when the others are asked again."""

from __future__ import annotations

from bridge.protocol.keyquery import LAST_RETRY_MS, Retries, answered, delay_ms, failed_servers, server_of

ALICE, BOB, CAROL = "@alice:remote.example:8448", "@bob:home.example", "@carol:other.example"
DOWN = {"status": 503, "message": "Failed to send request: ConnectionRefusedError"}


def test_people_of_a_server_named_in_failures_are_not_answered_for_even_when_listed():
    # Synapse gives what it has cached (no cross-signing keys) and names the server it could not reach.
    response = {"device_keys": {ALICE: {"PHONE": {"user_id": ALICE}}, BOB: {}},
                "failures": {"remote.example:8448": DOWN}, "master_keys": {}, "self_signing_keys": {}}
    assert answered({ALICE, BOB}, response) == {BOB}
    assert failed_servers(response) == {"remote.example:8448"}


def test_people_left_out_of_the_answer_are_not_answered_for():
    assert answered({ALICE, BOB, CAROL}, {"device_keys": {BOB: {}}, "failures": {}}) == {BOB}


def test_someone_with_no_device_at_all_is_answered_for():
    assert answered({BOB}, {"device_keys": {BOB: {}}}) == {BOB}


def test_a_malformed_answer_answers_for_nobody():
    for response in ({}, {"device_keys": []}, {"device_keys": {ALICE: []}}, {"device_keys": {ALICE: None}}):
        assert answered({ALICE}, response) == set()
    assert answered({BOB}, {"device_keys": {BOB: {}}, "failures": ["home.example"]}) == {BOB}  # not a dict


def test_the_server_of_a_user_keeps_its_port():
    assert server_of(ALICE) == "remote.example:8448"
    assert server_of("nobody") == ""


def test_asks_go_later_and_later_up_to_a_minute():
    assert [delay_ms(n) for n in range(1, 9)] == [1000, 2000, 4000, 8000, 16000, 32000, 60000, 60000]
    assert delay_ms(100) == LAST_RETRY_MS


def test_retries_are_due_after_their_own_backoff_and_leave_when_answered():
    retries = Retries()
    retries.add({ALICE, BOB}, now=0)
    assert retries.due(0) == {ALICE, BOB} and retries.due_in_ms(0) == 0
    assert retries.unanswered({ALICE}, now=0) == 1000
    retries.answered({BOB})
    assert BOB not in retries and ALICE in retries and len(retries) == 1
    assert retries.due(999) == set() and retries.due(1000) == {ALICE}
    assert retries.due_in_ms(400) == 600
    assert retries.unanswered({ALICE}, now=1000) == 2000  # second unanswered ask: twice as long
    assert retries.due(2999) == set() and retries.due(3000) == {ALICE}


def test_being_asked_about_again_does_not_cut_a_backoff_short():
    retries = Retries()
    retries.add({ALICE}, now=0)
    retries.unanswered({ALICE}, now=0)
    retries.unanswered({ALICE}, now=1000)  # due at 3000
    retries.add({ALICE, CAROL}, now=1500)  # her device list "changed" again, and a newcomer
    assert retries.due(1500) == {CAROL}
    assert retries.due(3000) == {ALICE, CAROL}


def test_nobody_waiting_means_no_wake_up():
    assert Retries().due_in_ms(0) is None
    retries = Retries()
    retries.add({ALICE}, 0)
    retries.answered({ALICE})
    assert retries.due_in_ms(0) is None
