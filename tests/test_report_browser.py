"""The HTML report in a real headless browser (Debian's Chromium): copied alone to another
folder, every image still loads, and the loss plot carries a legend."""

import json
import re
import shutil
import subprocess

import pytest

from shardkit.cli import main

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

# loads the copied report in an iframe and writes what it finds into this page's DOM
PROBE = """<!doctype html><html><body><iframe id="r" src="report.html" width="1200"
height="800"></iframe><script>
document.getElementById("r").addEventListener("load", () => {
  const doc = document.getElementById("r").contentDocument;
  const imgs = Array.from(doc.images);
  const wait = imgs.map(i => i.complete ? Promise.resolve() :
    new Promise(ok => { i.onload = ok; i.onerror = ok; }));
  Promise.all(wait).then(() => {
    const out = {title: doc.title, images: imgs.map(i => ({alt: i.alt,
      width: i.naturalWidth, legend: i.dataset.legend || ""}))};
    const pre = document.createElement("pre");
    pre.id = "result";
    pre.textContent = JSON.stringify(out);
    document.body.appendChild(pre);
  });
});
</script></body></html>"""


@pytest.mark.skipif(
    CHROMIUM is None,
    reason="Chromium is not installed: `make test` installs Debian's chromium package when "
    "apt-get can; install it (apt-get install chromium) to run this test",
)
def test_the_report_copied_alone_shows_every_image_and_the_loss_legend(tmp_path):
    run = tmp_path / "run"
    assert main(["train", "--steps", "20", "--out", str(run), "--quiet"]) == 0
    mailed = tmp_path / "mailed"
    mailed.mkdir()
    shutil.copy(run / "report.html", mailed / "report.html")  # no PNGs beside it
    (mailed / "probe.html").write_text(PROBE)
    out = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--allow-file-access-from-files",
         "--virtual-time-budget=15000", "--dump-dom", (mailed / "probe.html").as_uri()],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    found = re.search(r'<pre id="result">(.*?)</pre>', out.stdout, re.S)
    assert found, (out.stdout[-2000:], out.stderr[-2000:])
    result = json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    assert result["title"] == "shardkit train report"
    images = result["images"]
    assert len(images) >= 2 and all(i["width"] > 0 for i in images), images
    loss = next(i for i in images if i["alt"].startswith("training loss"))
    assert loss["legend"] == "training loss, accuracy", loss
