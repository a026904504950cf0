"""Masking passwords in store URLs and in text: the secret goes, what names the store stays.

A failure means a password would reach a terminal, a log or MLflow (secret kept), or a message
would no longer say which store it is about (user, host or database lost).
"""

from __future__ import annotations

import pytest

from precsearch.redact import MASK, redact_text, redact_url


@pytest.mark.parametrize(("url", "expected"), [
    ("postgresql://alice:s3cret@db.internal:5432/optuna", "postgresql://alice:***@db.internal:5432/optuna"),
    ("postgresql+psycopg2://alice:s3cret@127.0.0.1/db", "postgresql+psycopg2://alice:***@127.0.0.1/db"),
    ("mysql://root:p@ss:w/rd@host/db", "mysql://root:***@host/db"),  # unescaped '@', ':' and '/' in the password
    ("https://bob:tok3n@mlflow.example.com", "https://bob:***@mlflow.example.com"),
    ("https://mlflow.example.com/?token=abc123&x=1", "https://mlflow.example.com/?token=***&x=1"),
    ("postgresql://alice@host/db?password=s3cret", "postgresql://alice@host/db?password=***"),
    ("mssql+pyodbc://host/db?driver=x;PWD=s3cret", "mssql+pyodbc://host/db?driver=x;PWD=***"),
])
def test_password_is_masked_and_the_rest_kept(url, expected):
    assert redact_url(url) == expected


@pytest.mark.parametrize("url", [
    "sqlite:////tmp/out/optuna.db",
    "journal:/tmp/out/journal.log",
    "http://127.0.0.1:5000",
    "postgresql://alice@host/db",  # a user without a password
    "file:///tmp/mlartifacts",
])
def test_urls_without_a_secret_are_unchanged(url):
    assert redact_url(url) == url


def test_every_url_in_a_yaml_text_is_masked():
    text = ("study:\n  storage: postgresql://u:secret1@127.0.0.1:1/db  # prod\n"
            "tracking: {uri: 'https://u:secret2@mlflow.example.com', experiment: e}\n"
            "note: \"see http://x/?api_key=secret3\"\n")
    out = redact_text(text)
    assert not any(s in out for s in ("secret1", "secret2", "secret3")), out
    assert out.count(MASK) == 3
    assert "postgresql://u:***@127.0.0.1:1/db  # prod" in out  # the line is otherwise intact


def test_error_message_quoting_the_url_is_masked():
    message = "cannot open Optuna storage 'postgresql://u:hunter2@h/db': (psycopg2.OperationalError) refused"
    assert redact_text(message) == ("cannot open Optuna storage 'postgresql://u:***@h/db': "
                                    "(psycopg2.OperationalError) refused")
