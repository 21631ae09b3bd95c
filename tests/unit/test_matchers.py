import pytest

from promreflex.matchers import parse_matcher


@pytest.mark.parametrize(
    "text, labels, expected",
    [
        ('alertname="X"', {"alertname": "X"}, True),
        ('alertname="X"', {"alertname": "Y"}, False),
        ('alertname!="X"', {"alertname": "Y"}, True),
        ('severity=~"warning|critical"', {"severity": "critical"}, True),
        ('severity=~"warn"', {"severity": "warning"}, False),  # anchored, as in Alertmanager
        ('severity!~"info|none"', {"severity": "info"}, False),
        ('team=""', {}, True),  # an absent label matches as the empty string
        ("site=shop", {"site": "shop"}, True),  # unquoted values are accepted
        ('msg="a \\"quoted\\" word"', {"msg": 'a "quoted" word'}, True),
    ],
)
def test_matching(text, labels, expected):
    assert parse_matcher(text).matches(labels) is expected


@pytest.mark.parametrize("bad", ["alertname", '="x"', 'a=~"("', 'a="x', "1a=b"])
def test_bad_matchers_say_what_is_wrong(bad):
    with pytest.raises(ValueError, match=r"matcher|regular expression|quote"):
        parse_matcher(bad)
