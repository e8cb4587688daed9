"""The demo's launch lines: where it runs, and our `--share` flag instead of Gradio's "set share=True in
launch()" (the app's own flag is what a user can change)."""

from __future__ import annotations

import socket

from .test_demo import load_app


def test_launch_names_our_share_flag_not_gradios(capsys):
    import gradio as gr  # here, not at collection: 2 s of import

    app = load_app()
    with gr.Blocks() as blocks:
        gr.Markdown("a demo")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    try:
        _, url, _ = app.launch(blocks, host="127.0.0.1", port=port, prevent_thread_lock=True)
        out = capsys.readouterr().out
    finally:
        blocks.close()
    assert out.splitlines() == [f"* Running on local URL:  {url}", "* For a public link, add --share."]
    assert "share=True" not in out
