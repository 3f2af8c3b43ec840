"""The report as a document: a list of blocks, written out as Markdown (report.md) and that Markdown
rendered by Python-Markdown into one self-contained HTML page (report.html: the figures embedded,
long lists, tables and cells folded away, the headings' ids those report.md links to).

    ("h1"|"h2"|"h3"|"p", text)  ("list", [text])  ("table", [header], [[cell]])  ("figure", file, caption)

Text may hold **bold** and `code` (code() makes the latter); every other character is shown as it is.
"""
import base64
import html
import re
import xml.etree.ElementTree as etree

import markdown
from markdown.extensions import Extension
from markdown.treeprocessors import Treeprocessor

LONG = 8  # in the HTML report, a list or table of more items than this is folded away
HEADINGS = ("h1", "h2", "h3")
MARKS = re.compile(r"(`[^`]*`|\*\*)")  # the marks text may hold: `code`, and ** around bold
# What Markdown would read as markup in the rest of the text: a backslash, a lone asterisk, an
# underscore at the edge of a word (a note's data/train_*.bin, a path with a backslash).
SPECIAL = re.compile(r"\\|\*|(?<!\w)_|_(?!\w)")


def plus_minus(value, se):
    """'+0.0123 ± 0.0004': a difference (of losses, say) and its standard error; n/a for a missing
    or NaN one (a single sequence has none)."""
    return f"{value:+.4f} ± " + ("n/a" if se is None or se != se else f"{se:.4f}")


def code(text):
    return "`" + str(text).replace("`", "'") + "`"


def plain(text):
    """Text without its **bold** and `code` marks."""
    return re.sub(r"`(.*?)`", r"\1", re.sub(r"\*\*(.+?)\*\*", r"\1", str(text)))


def markdown_text(text):
    """Text as Markdown: its marks kept, what else Markdown would read as markup escaped, a line
    break a space (as HTML shows it; in Markdown it would end a table's row); an empty value
    (code() of "" gives an empty pair of backticks) shows as nothing."""
    text = "" if str(text) == "``" else re.sub(r"\r\n?|\n", " ", str(text))
    return "".join(part if MARKS.fullmatch(part) else SPECIAL.sub(r"\\\g<0>", part) for part in MARKS.split(text))


def anchors(blocks):
    """The anchor of every heading, in order, as GitHub makes them (so that report.md's links work
    there and report.html uses the same ids): the text without marks, in lower case, without
    anything but letters, digits, _, - and spaces, spaces made -; a repeated one gets -1, -2, ..."""
    out = []
    for block in blocks:
        if block[0] in HEADINGS:
            slug = re.sub(r"[^\w\- ]", "", plain(block[1]).strip().lower()).replace(" ", "-") or "section"
            anchor, n = slug, 0
            while anchor in out:
                n += 1
                anchor = f"{slug}-{n}"
            out.append(anchor)
    return out


def contents(blocks):
    """The table of contents: [(h2 text, anchor, [(h3 text, anchor)])], the h3s under the h2 before them."""
    toc = []
    headings = [b for b in blocks if b[0] in HEADINGS]
    for (kind, text, *_), anchor in zip(headings, anchors(blocks)):
        if kind == "h2" or (kind == "h3" and not toc):
            toc.append((text, anchor, []))
        elif kind == "h3":
            toc[-1][2].append((text, anchor))
    return toc


def md_link(text, anchor):
    return "[" + re.sub(r"([\[\]])", r"\\\1", markdown_text(plain(text))) + f"](#{anchor})"


def to_markdown(blocks):
    """report.md: the blocks, with the table of contents after the title (the h1), or first."""
    out = []
    toc = contents(blocks)
    if toc:  # nested items indented by two spaces, as GitHub's and report.html's renderers read them
        links = [f"- {md_link(text, anchor)}" + "".join(f"\n  - {md_link(t, a)}" for t, a in subs)
                 for text, anchor, subs in toc]
        at = 1 if blocks[0][0] == "h1" else 0
        blocks = blocks[:at] + [("contents", links)] + blocks[at:]
    for i, (kind, *parts) in enumerate(blocks):
        if kind in HEADINGS:
            out.append("#" * int(kind[1]) + " " + markdown_text(parts[0]) + "\n")
        elif kind == "contents":
            out.append("**Contents**\n\n" + "\n".join(parts[0]) + "\n")
        elif kind == "p":
            out.append(markdown_text(parts[0]) + "\n")
        elif kind == "list":  # a comment between two lists keeps them apart
            out.append("<!-- -->\n" * (i > 0 and blocks[i - 1][0] == "list")
                       + "\n".join(f"- {markdown_text(item)}" for item in parts[0]) + "\n")
        elif kind == "table":
            cells = lambda row: "| " + " | ".join(markdown_text(c).replace("|", "\\|") for c in row) + " |"
            out.append("\n".join([cells(parts[0]), "|" + "---|" * len(parts[0])] + [cells(r) for r in parts[1]]) + "\n")
        elif kind == "figure":
            out.append(f"![{parts[0]}]({parts[0]})\n\n*{markdown_text(parts[1])}*\n")
    return "\n".join(out)


STYLE = """body { font-family: sans-serif; max-width: 1100px; margin: 2em auto; padding: 0 1em; line-height: 1.45; }
table { border-collapse: collapse; margin: 1em 0; font-size: 0.92em; }
th, td { border: 1px solid #bbb; padding: 0.3em 0.6em; text-align: left; vertical-align: top; }
th { background: #eee; }
figure { margin: 2em 0; }
img { max-width: 100%; border: 1px solid #ddd; }
figcaption { font-size: 0.95em; color: #333; margin-top: 0.4em; }
code { background: #f3f3f3; padding: 0 0.2em; }
nav.toc { border: 1px solid #ddd; background: #fafafa; padding: 0.2em 1em; margin: 1em 0; }
nav.toc ul { margin: 0.2em 0; }
details { margin: 0.5em 0; }
summary { cursor: pointer; color: #225; }"""


def to_html(blocks, title, outdir, refresh=None):
    """report.html: report.md as one self-contained page, its figures read from outdir; refresh:
    seconds after which a browser reloads it (while the run it reports is still training), or None."""
    page = markdown.Markdown(extensions=["tables", Page(anchors(blocks), outdir)], tab_length=2, output_format="html")
    meta = f'<meta http-equiv="refresh" content="{int(refresh)}">' if refresh else ""
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">{meta}"
            f"<title>{html.escape(title)}</title><style>{STYLE}</style></head><body>\n"
            + page.convert(to_markdown(blocks)) + "\n</body></html>\n")


class Page(Extension):
    """Python-Markdown, reading report.md for report.html: text is text (a "<" in it is shown, not
    read as HTML; only a line of HTML of its own, the comment between two lists, passes as HTML);
    the tree it makes is then laid out as the page (PageLayout)."""

    def __init__(self, anchors, outdir):
        super().__init__()
        self.anchors, self.outdir = anchors, outdir

    def extendMarkdown(self, md):
        md.inlinePatterns.deregister("html")
        md.treeprocessors.deregister("prettify")  # no line breaks between the cells of a row
        md.treeprocessors.register(PageLayout(md, self.anchors, self.outdir), "page_layout", -10)


class PageLayout(Treeprocessor):
    """Each heading gets its anchor as id; the table of contents goes into a <nav>; each figure, an
    image and its caption, becomes a <figure> with the image embedded; lists and tables of more than
    LONG items, and cells holding a list of more than LONG single words ("L0H1, L0H3, ..."), are
    folded into a <details> whose summary says what they hold."""

    def __init__(self, md, anchors, outdir):
        super().__init__(md)
        self.anchors, self.outdir = anchors, outdir

    def run(self, root):
        ids = iter(self.anchors)
        for element in root.iter():
            if element.tag in HEADINGS:
                element.set("id", next(ids))
            elif element.tag == "td":
                for inner in element.iter("code"):  # a | in code, escaped for the table
                    inner.text = (inner.text or "").replace("\\|", "|")
                items = (element.text or "").split(", ")
                if len(element) == 0 and len(items) > LONG and all(i and not re.search(r"[\s,]", i) for i in items):
                    element.text, summary = None, ", ".join(items[:3]) + f", \u2026 ({len(items)} in all)"
                    element.append(folded(summary, ", ".join(items)))
        laid_out, children, i = [], list(root), 0
        while i < len(children):
            element, after = children[i], children[i + 1] if i + 1 < len(children) else None
            i += 1
            if only(element, "strong") and element[0].text == "Contents" and after is not None and after.tag == "ul":
                laid_out.append(etree.Element("nav", {"class": "toc"}))
                laid_out[-1].extend([element, after])
                i += 1
            elif only(element, "img") and only(after, "em"):
                laid_out.append(self.figure(element[0], after[0]))
                i += 1
            elif element.tag == "ul" and len(element) > LONG:
                laid_out.append(folded(f"{len(element)} items", element))
            elif element.tag == "table" and len(element.findall("tbody/tr")) > LONG:
                header = ", ".join("".join(th.itertext()) for th in element.iter("th"))
                laid_out.append(folded(f"{len(element.findall('tbody/tr'))} rows: {header}", element))
            else:
                laid_out.append(element)
        root[:] = laid_out

    def figure(self, image, caption):
        data = base64.b64encode((self.outdir / image.get("src")).read_bytes()).decode("ascii")
        figure = etree.Element("figure")
        etree.SubElement(figure, "img", {"alt": image.get("alt"), "src": f"data:image/png;base64,{data}"})
        figcaption = etree.SubElement(figure, "figcaption")
        figcaption.text = caption.text
        figcaption.extend(list(caption))
        return figure


def only(element, tag):
    """Whether element is a paragraph holding one element of this tag and nothing else."""
    return (element is not None and element.tag == "p" and len(element) == 1 and element[0].tag == tag
            and not element.text and not element[0].tail)


def folded(summary, content):
    """<details>: the summary, and content (an element or text) shown when it is unfolded."""
    details = etree.Element("details")
    etree.SubElement(details, "summary").text = summary
    if isinstance(content, str):
        details[0].tail = content
    else:
        details.append(content)
    return details
