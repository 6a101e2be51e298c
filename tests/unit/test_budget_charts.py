"""The budget service's charts are well-formed SVG with the shapes and labels they promise."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from spawner.readmodel.service import charts

SVG = "{http://www.w3.org/2000/svg}"


def parse(markup: str) -> ET.Element:
    return ET.fromstring(str(markup))


def test_used_against_share_draws_the_bar_to_scale_and_marks_the_share() -> None:
    half, over = (
        parse(charts.used_against_share(0.5, "t")),
        parse(charts.used_against_share(2, "t")),
    )
    width = {
        name: float(svg.find(f"{SVG}rect[@class='used']").get("width"))
        for name, svg in (("half", half), ("over", over))
    }
    assert 0 < width["half"] < width["over"]
    assert half.find(f"{SVG}line") is not None and "50%" in ET.tostring(half, "unicode")
    assert "no share" in str(charts.used_against_share(None, "t"))


def test_owed_delivered_has_a_bar_per_day_and_the_owed_line() -> None:
    days = [(86400.0 * i, 3600.0 * 24, 3600.0 * i) for i in range(30)]
    svg = parse(charts.owed_delivered(days, "GPU", "owed <and> delivered"))
    bars = svg.findall(f"{SVG}rect[@class='delivered']")
    assert len(bars) == 30
    heights = [float(b.get("height")) for b in bars]
    assert heights == sorted(heights) and heights[0] == 0
    assert svg.find(f"{SVG}polyline[@class='owed']") is not None
    assert svg.find(f"{SVG}title").text == "owed <and> delivered"  # escaped, then read back


def test_ratio_bars_usage_lines_and_slices_name_what_they_show() -> None:
    ratios = parse(charts.ratio_bars([("a&b", 0.5, 0.5), ("c", float("inf"), 0.0)], "r"))
    assert len(ratios.findall(f"{SVG}rect[@class='ratio-bar']")) == 2
    assert "a&b (50%)" in ET.tostring(ratios, "unicode").replace("&amp;", "&")
    lines = parse(charts.usage_lines([("nlp", [(0.0, 3600.0), (1.0, 0.0)])], "GPU", "u"))
    assert len(lines.findall(f"{SVG}polyline[@class='usage']")) == 1
    grid = parse(charts.slice_grid([("GPU 0", "whole", "x/y/1"), ("GPU 1", "whole", "")], "s"))
    assert len(grid.findall(f"{SVG}rect[@class='slice held']")) == 1
    assert len(grid.findall(f"{SVG}rect[@class='slice free']")) == 1
