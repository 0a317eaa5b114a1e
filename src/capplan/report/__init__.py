"""`capplan report`: a plan as one self-contained HTML page with figures a person can forward."""

from capplan.report.render import render_report

__all__ = ["render_report"]
