"""The who-holds-what figure: it draws exactly the pieces it is given, legibly."""

import matplotlib
import pytest

matplotlib.use("Agg")

from ringlab.show.ownership import FONT, KINDS, Piece, held_fraction, plot_who_holds_what


def quarters(n=4):
    return {r: [Piece("params", r / n, (r + 1) / n, "parameters", f"shard {r}"),
                Piece("unit 2", 0, 1, "gathered", "all shards")] for r in range(n)}


def test_each_piece_is_one_filled_box_where_it_says():
    fig = plot_who_holds_what(quarters())
    ax = fig.axes[0]
    filled = [p for p in ax.patches if p.get_fill()]
    assert len(filled) == 8                      # 4 shards + 4 gathered units
    shards = sorted((p.get_y(), p.get_x(), p.get_width()) for p in filled
                    if p.get_facecolor()[:3] == matplotlib.colors.to_rgb(KINDS["parameters"]))
    assert [(round(x, 6), round(w, 6)) for _, x, w in shards] == \
        [(0.0, 0.25), (0.25, 0.25), (0.5, 0.25), (0.75, 0.25)]
    assert [round(y, 2) for y, _, _ in shards] == [0.12, 1.12, 2.12, 3.12]   # rank r on row r


def test_every_text_is_at_least_the_body_size_and_inside_the_figure():
    fig = plot_who_holds_what(quarters(8), title="ZeRO-3")
    fig.canvas.draw()
    texts = [t for ax in fig.axes for t in ax.texts + ax.get_yticklabels()] + fig.texts
    texts += [t for leg in fig.legends for t in leg.get_texts()]
    assert texts and min(t.get_fontsize() for t in texts) >= FONT
    box = fig.bbox
    renderer = fig.canvas.get_renderer()
    for t in texts:
        e = t.get_window_extent(renderer)
        assert box.x0 <= e.x0 and e.x1 <= box.x1 and box.y0 <= e.y0 and e.y1 <= box.y1, t


def test_a_text_too_wide_for_its_piece_goes_beside_it():
    h = {0: [Piece("W", 0.0, 0.05, "parameters", "a long label")]}
    ax = plot_who_holds_what(h).axes[0]
    label = [t for t in ax.texts if t.get_text() == "a long label"][0]
    assert label.get_horizontalalignment() == "left" and label.get_position()[0] > 0.05


def test_held_fraction_counts_overlaps_once():
    h = {0: [Piece("W", 0, 0.5), Piece("W", 0.25, 0.75), Piece("V", 0, 1)]}
    assert held_fraction(h, 0, "W") == 0.75 and held_fraction(h, 0, "V") == 1


@pytest.mark.parametrize("piece, words", [
    (lambda: Piece("W", 0.5, 0.5), "0 <= start < stop <= 1"),
    (lambda: Piece("W", 0, 1.5), "0 <= start < stop <= 1"),
    (lambda: Piece("W", 0, 1, "weights"), "kind 'weights'")])
def test_bad_pieces_say_what_was_expected(piece, words):
    with pytest.raises(ValueError, match=words.replace("(", r"\(")):
        piece()


def test_columns_must_name_every_tensor():
    with pytest.raises(ValueError, match=r"not among the columns: \['V'\]"):
        plot_who_holds_what({0: [Piece("W", 0, 1), Piece("V", 0, 1)]}, tensors=["W"])
    with pytest.raises(ValueError, match="nothing to draw"):
        plot_who_holds_what({})


def test_a_text_on_a_light_kind_is_black_on_a_dark_one_white():
    h = {0: [Piece("g", 0, 1, "full gradients", "full"), Piece("p", 0, 1, "parameters", "mine")]}
    colours = {t.get_text(): t.get_color() for t in plot_who_holds_what(h).axes[0].texts}
    assert colours["full"] == "black" and colours["mine"] == "white"
    assert KINDS["full gradients"] != KINDS["gradients"]


def test_dividers_mark_each_row_of_their_column_only():
    h = {r: [Piece("W", 0, 0.25), Piece("V", 0, 1)] for r in range(3)}
    ax = plot_who_holds_what(h, dividers={"W": [0.25, 0.5]}).axes[0]
    xs = sorted((line.get_xdata()[0], line.get_ydata()[0]) for line in ax.lines)
    assert xs == [(x, r + 0.12) for x in (0.25, 0.5) for r in range(3)]     # column W at x 0
    with pytest.raises(ValueError, match=r"not among the columns: \['U'\]"):
        plot_who_holds_what(h, dividers={"U": [0.5]})


def test_the_legend_is_left_out_when_asked_and_the_figure_shorter():
    h = quarters()
    with_legend, without = plot_who_holds_what(h), plot_who_holds_what(h, legend=False)
    assert len(with_legend.legends) == 1 and without.legends == []
    assert without.get_size_inches()[1] == pytest.approx(with_legend.get_size_inches()[1] - 0.35)
    assert plot_who_holds_what(h, legend=True).get_size_inches()[1] == \
        with_legend.get_size_inches()[1]
