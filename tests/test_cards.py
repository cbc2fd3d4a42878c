import pytest

from lora_gui.cards import CARDS, card_by_name, card_names


def test_every_card_is_found_by_its_name_in_any_case():
    for name in card_names():
        assert card_by_name(f" {name.upper()} ") is CARDS[name]


def test_an_unknown_card_lists_the_known_ones():
    with pytest.raises(ValueError) as err:
        card_by_name("rtx-9999")
    assert "rtx-9999" in str(err.value) and "a100-80gb" in str(err.value)


def test_card_sizes_are_device_totals_not_decimal_labels():
    assert CARDS["8gb"].total_bytes < 8 * 2**30  # an "8 GB" card holds less than 8 GiB
    assert CARDS["h200"].total_gib > 139
