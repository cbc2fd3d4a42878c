"""A preference run's rewards are charted live beside its loss; other runs' loss chart is as before."""

from lora_gui.ui.charts import loss_figure


def _records(n: int, preference: bool) -> list[dict]:
    rows = []
    for step in range(1, n + 1):
        row = {"step": step, "loss": 0.7 - 0.01 * step}
        if preference:
            row |= {"rewards_chosen": 0.1 * step, "rewards_rejected": -0.05 * step,
                    "reward_margin": 0.15 * step, "reward_accuracy": min(1.0, 0.2 * step)}
        rows.append(row)
    return rows


def test_preference_rewards_join_the_loss_chart_on_their_own_axis():
    fig = loss_figure(_records(6, True), smoothing=0.5)
    names = [t.name for t in fig.data]
    assert names[:2] == ["train loss", "EMA 0.5"]
    assert names[2:] == ["reward chosen", "reward rejected", "reward margin", "reward accuracy"]
    margin = next(t for t in fig.data if t.name == "reward margin")
    assert margin.yaxis == "y2" and list(margin.y) == [0.15 * s for s in range(1, 7)]
    assert fig.layout.title.text == "Loss and rewards"


def test_a_next_token_run_keeps_its_loss_chart():
    fig = loss_figure(_records(4, False))
    assert [t.name for t in fig.data] == ["train loss"] and fig.layout.title.text == "Loss"
