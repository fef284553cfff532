"""A deterministic, seeded generator of synthetic clinical notes (the embedded default corpus).

Patients have several admissions; each admission has several notes (discharge summaries,
progress notes) with the sections of a real discharge summary, vitals, problems, tests and
treatments drawn from public lexicons (``lexicons/README.md`` gives sources and licences), and
PHI-like fields (names, dates, medical record numbers) so that privacy attacks have something to
find. Nothing here describes a real person.

The generator streams (one note at a time) and is deterministic: the same seed and sizes give
byte-identical notes. With ``with_labels`` it also yields word-level BIO tags for the
problem / test / treatment mentions, aligned with ``dpbert.data.words.split_words``.
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import json
import os
import random
import tempfile
from functools import lru_cache
from pathlib import Path
from typing import Iterator, List, Optional, Tuple

from dpbert.data.readers import Document
from dpbert.data.words import split_words

LEXICON_DIR = Path(__file__).resolve().parent / "lexicons"
ENTITY_TYPES = ("problem", "test", "treatment")


@lru_cache(maxsize=None)
def lexicon(name: str) -> Tuple[str, ...]:
    path = LEXICON_DIR / f"{name}.txt"
    return tuple(line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip())


@dataclasses.dataclass(frozen=True)
class LabeledNote:
    document: Document
    words: Tuple[str, ...]
    tags: Tuple[str, ...]


class _Note:
    """Accumulates (text, entity type) pieces; renders text and word-level BIO tags."""

    def __init__(self):
        self.pieces: List[Tuple[str, Optional[str]]] = []

    def add(self, text: str, entity: Optional[str] = None):
        self.pieces.append((text, entity))

    def text(self) -> str:
        return "".join(text for text, _ in self.pieces)

    def words_and_tags(self):
        words, tags = [], []
        for text, entity in self.pieces:
            piece_words = split_words(text)
            for i, word in enumerate(piece_words):
                words.append(word)
                tags.append("O" if entity is None else ("B-" if i == 0 else "I-") + entity)
        return words, tags


_DOSES = ("5 mg", "10 mg", "20 mg", "25 mg", "40 mg", "50 mg", "100 mg", "250 mg", "500 mg", "1 g")
_ROUTES = ("po", "iv", "sc", "im")
_FREQ = ("daily", "bid", "tid", "qid", "q6h", "q8h", "qhs", "prn")
_SEX = ("male", "female")
_NOTE_TYPES = ("discharge summary", "progress note", "admission note")
_RESULTS = ("unremarkable", "within normal limits", "elevated", "mildly elevated", "decreased",
            "markedly abnormal", "pending at discharge", "negative", "positive")
_HPI = (
    "{age} year old {sex} with a history of {p1} who presents with {p2}.",
    "Patient is a {age} yo {sex} with {p1} admitted for evaluation of {p2}.",
    "{age} y/o {sex} with known {p1}, sent from clinic with worsening {p2}.",
)
_COURSE = (
    "{p} was treated with {t} with good response.",
    "For {p} the patient was started on {t}.",
    "{p} improved after {t} was initiated.",
    "{x} showed {r}; {t} was continued for {p}.",
    "Given {p}, {x} was obtained and was {r}.",
)


class _Patient:
    def __init__(self, rng: random.Random, index: int):
        self.patient_id = f"P{index:06d}"
        self.first = rng.choice(lexicon("given_names"))
        self.last = rng.choice(lexicon("surnames"))
        self.mrn = f"{rng.randrange(10**6, 10**7)}"
        self.sex = rng.choice(_SEX)
        self.birth = dt.date(2030, 1, 1) + dt.timedelta(days=rng.randrange(0, 365 * 70))
        self.problems = rng.sample(lexicon("problems_bc5cdr"), 4)
        self.treatments = rng.sample(lexicon("treatments_bc5cdr"), 4)


def _entity(note: _Note, text: str, kind: str):
    note.add(text, kind)


def _render_note(rng: random.Random, patient: _Patient, admit: dt.date, discharge: dt.date,
                 note_type: str) -> _Note:
    note = _Note()
    age = (admit - patient.birth).days // 365
    name = f"{patient.first.capitalize()} {patient.last.capitalize()}"
    note.add(f"{note_type.upper()}\nName: {name}   MRN: {patient.mrn}   "
             f"DOB: {patient.birth:%m/%d/%Y}\nAdmission Date: {admit:%m/%d/%Y}   "
             f"Discharge Date: {discharge:%m/%d/%Y}\nAttending: Dr. "
             f"{rng.choice(lexicon('surnames')).capitalize()}\n\n")
    problems = list(patient.problems) + rng.sample(lexicon("problems_bc5cdr"), 2)
    main, other = problems[0], problems[1:]

    note.add("CHIEF COMPLAINT: ")
    _entity(note, main, "problem")
    note.add("\n\nHISTORY OF PRESENT ILLNESS: ")
    template = rng.choice(_HPI)
    head, rest = template.split("{p1}")
    note.add(head.format(age=age, sex=patient.sex))
    _entity(note, other[0], "problem")
    mid, tail = rest.split("{p2}")
    note.add(mid)
    _entity(note, main, "problem")
    note.add(tail + f" Mr./Ms. {patient.last.capitalize()} reports symptoms for "
             f"{rng.randint(1, 14)} days.\n\n")

    note.add("PAST MEDICAL HISTORY:\n")
    for p in other[:3]:
        note.add("- ")
        _entity(note, p, "problem")
        note.add("\n")
    note.add("\nMEDICATIONS ON ADMISSION:\n")
    for t in patient.treatments[:3]:
        note.add("- ")
        _entity(note, t, "treatment")
        note.add(f" {rng.choice(_DOSES)} {rng.choice(_ROUTES)} {rng.choice(_FREQ)}\n")
    note.add(f"\nALLERGIES: {rng.choice(['nkda', 'penicillin', 'sulfa', 'codeine'])}\n\n")
    note.add(f"SOCIAL HISTORY: lives with {rng.choice(['spouse', 'daughter', 'son', 'alone'])}, "
             f"{rng.choice(['former', 'current', 'never'])} smoker. Phone "
             f"({rng.randint(200, 999)}) {rng.randint(200, 999)}-{rng.randint(1000, 9999)}.\n\n")
    note.add(f"PHYSICAL EXAM: T {rng.uniform(36.0, 39.5):.1f} HR {rng.randint(50, 130)} "
             f"BP {rng.randint(90, 180)}/{rng.randint(50, 100)} RR {rng.randint(12, 28)} "
             f"SpO2 {rng.randint(88, 100)}% on {rng.choice(['ra', '2l nc', '4l nc'])}.\n\n")
    note.add("PERTINENT RESULTS:\n")
    for x in rng.sample(lexicon("tests"), 3):
        _entity(note, x, "test")
        note.add(f" {rng.choice(_RESULTS)}.\n")
    note.add("\nBRIEF HOSPITAL COURSE:\n")
    for _ in range(rng.randint(3, 6)):
        template = rng.choice(_COURSE)
        values = {"p": rng.choice(problems), "t": rng.choice(patient.treatments + list(
            rng.sample(lexicon("treatments_bc5cdr"), 1))), "x": rng.choice(lexicon("tests")),
                  "r": rng.choice(_RESULTS)}
        kinds = {"p": "problem", "t": "treatment", "x": "test", "r": None}
        text = template
        while "{" in text:
            before, after = text.split("{", 1)
            key, text = after[0], after[2:]
            note.add(before[:1].upper() + before[1:] if not note.pieces[-1][0].endswith(" ") else before)
            value = values[key]
            if kinds[key]:
                _entity(note, value, kinds[key])
            else:
                note.add(value)
        note.add(text + " ")
    note.add("\n\nASSESSMENT AND PLAN:\n")
    for i, p in enumerate([main] + other[:2], start=1):
        note.add(f"{i}. ")
        _entity(note, p, "problem")
        note.add(": continue ")
        _entity(note, rng.choice(patient.treatments), "treatment")
        note.add(f", follow up with Dr. {rng.choice(lexicon('surnames')).capitalize()} in "
                 f"{rng.randint(1, 6)} weeks.\n")
    note.add(f"\nDISCHARGE DIAGNOSIS: ")
    _entity(note, main, "problem")
    note.add(f"\nDischarged to {rng.choice(['home', 'rehab', 'home with services'])} on "
             f"{discharge:%m/%d/%Y}. Signed electronically.\n")
    return note


def generate_labeled_notes(patients: int = 40, admissions_per_patient: int = 2,
                           notes_per_admission: int = 2, seed: int = 1234) -> Iterator[LabeledNote]:
    """Stream synthetic notes with word-level BIO tags (problem / test / treatment)."""
    for note, document in _generate(patients, admissions_per_patient, notes_per_admission, seed):
        words, tags = note.words_and_tags()
        yield LabeledNote(document=document, words=tuple(words), tags=tuple(tags))


def generate_notes(patients: int = 40, admissions_per_patient: int = 2, notes_per_admission: int = 2,
                   seed: int = 1234) -> Iterator[Document]:
    """Stream synthetic notes as ``Document``s with patient, admission and note ids."""
    for _, document in _generate(patients, admissions_per_patient, notes_per_admission, seed):
        yield document


def _generate(patients, admissions_per_patient, notes_per_admission, seed):
    for name, value in (("patients", patients), ("admissions_per_patient", admissions_per_patient),
                        ("notes_per_admission", notes_per_admission)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    for p in range(patients):
        # One RNG per patient, derived from (seed, patient): notes do not depend on how many
        # patients come before, so corpora of different sizes share their first patients.
        rng = random.Random(f"{seed}:{p}")
        patient = _Patient(rng, p)
        # Dates are shifted into the future, as MIMIC does, so no real date of care is suggested.
        admit = patient.birth + dt.timedelta(days=365 * rng.randint(25, 85) + rng.randrange(0, 365))
        for a in range(admissions_per_patient):
            stay = rng.randint(1, 12)
            discharge = admit + dt.timedelta(days=stay)
            admission_id = f"{patient.patient_id}-A{a}"
            for n in range(notes_per_admission):
                note = _render_note(rng, patient, admit, discharge, _NOTE_TYPES[n % len(_NOTE_TYPES)])
                note_id = f"{admission_id}-N{n}"
                yield note, Document(doc_id=note_id, text=note.text(), patient_id=patient.patient_id,
                                     admission_id=admission_id, note_id=note_id)
            admit = discharge + dt.timedelta(days=rng.randint(30, 400))


def write_jsonl(documents, path) -> int:
    """Write documents as the JSONL corpus format; returns the number written.

    Atomic: the documents go to a temporary file in the same directory, renamed over ``path``
    only once every document is written, so an error (in the generator or the disk) leaves an
    existing ``path`` as it was and no partial file behind.
    """
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
    try:
        count = 0
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            for d in documents:
                out.write(json.dumps({"text": d.text, "patient_id": d.patient_id,
                                      "admission_id": d.admission_id, "note_id": d.note_id}) + "\n")
                count += 1
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return count


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
