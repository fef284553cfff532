"""A deterministic, seeded generator of synthetic clinical notes (the embedded default corpus).

Patients have several admissions; each admission has several notes (discharge summaries,
progress notes) with the sections of a real discharge summary, vitals, problems, tests and
treatments drawn from public lexicons (``lexicons/README.md`` gives sources and licences), and
PHI-like fields (names, dates, medical record numbers) so that privacy attacks have something to
find. Nothing here describes a real person.

The generator streams (one note at a time) and is deterministic: the same seed and sizes give
byte-identical notes. With ``with_labels`` it also yields word-level BIO tags for the
problem / test / treatment mentions, aligned with ``dpbert.data.words.split_words``.

Shapes (``corpus.synthetic.shape``). ``fixed`` (default): every patient has
``admissions_per_patient`` × ``notes_per_admission`` notes (the demo: 1 × 1, one note per patient).
``hospital``: notes per patient drawn heavy-tailed (:func:`hospital_note_count`: median 2–3, mean
≈ 6, cap :data:`HOSPITAL_MAX_NOTES`) over 1–5 admissions, of four types (discharge summary,
progress, nursing, radiology), the patient's name, MRN, birth date, chronic problems and drugs the
same in all of them; any patient's notes come on demand (:func:`hospital_patient_notes`) and the
corpus streams patient by patient. docs/data.md gives the measured rate and the distribution.

Seeds. A corpus's notes come from one RNG per patient keyed ``"{seed}:{patient}"`` (any integer
seed: ``corpus.synthetic.seed``, default 1234; the NER stage's held-out MLM text uses 987654321, the
canary carriers their own). The in-domain NER task (:func:`ner_sentences`, ``ner.task:
synthetic``) draws its FRESH patients from a separate stream keyed ``"ner:{split}:{seed}:{patient}"``
(public seed :data:`NER_SEED`): the ``ner:`` prefix makes that key differ from every corpus key
``"{seed}:{patient}"`` whatever the two seeds, so no training corpus holds an NER patient.

The NER task (the analogue of the paper's i2b2-2010 concept extraction): sentences of fresh
patients' notes and of free-text clinical sentences (varied contexts: negations, orders,
abbreviations, lists), each problem / test / treatment mention labelled BIO by the generator
itself (it knows which lexicon each inserted span came from), with typos in a few words. Each
lexicon is split by a keyed hash into a training part and a HELD-OUT part (:func:`lexicon_split`,
~30 %): training sentences use the training part only, test sentences half held-out entries, so
a model must recognise unseen entities from their context — which in-domain pre-training (whose
corpus uses the whole lexicons) can teach and a public encoder cannot.
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import hashlib
import json
import math
import os
import random
import re
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


#: The entity lexicons of each entity type.
ENTITY_LEXICONS = {"problem": "problems_bc5cdr", "test": "tests", "treatment": "treatments_bc5cdr"}


def _lex(lexicons, name):
    """``lexicons[name]`` when a restricted set is given (the NER task's splits), else the whole lexicon."""
    return lexicons[name] if lexicons is not None and name in lexicons else lexicon(name)


class _Patient:
    def __init__(self, rng: random.Random, index: int, lexicons=None):
        self.patient_id = f"P{index:06d}"
        self.first = rng.choice(lexicon("given_names"))
        self.last = rng.choice(lexicon("surnames"))
        self.mrn = f"{rng.randrange(10**6, 10**7)}"
        self.sex = rng.choice(_SEX)
        self.birth = dt.date(2030, 1, 1) + dt.timedelta(days=rng.randrange(0, 365 * 70))
        self.problems = rng.sample(_lex(lexicons, "problems_bc5cdr"), 4)
        self.treatments = rng.sample(_lex(lexicons, "treatments_bc5cdr"), 4)


def _entity(note: _Note, text: str, kind: str):
    note.add(text, kind)


def _render_note(rng: random.Random, patient: _Patient, admit: dt.date, discharge: dt.date,
                 note_type: str, lexicons=None) -> _Note:
    note = _Note()
    age = (admit - patient.birth).days // 365
    name = f"{patient.first.capitalize()} {patient.last.capitalize()}"
    note.add(f"{note_type.upper()}\nName: {name}   MRN: {patient.mrn}   "
             f"DOB: {patient.birth:%m/%d/%Y}\nAdmission Date: {admit:%m/%d/%Y}   "
             f"Discharge Date: {discharge:%m/%d/%Y}\nAttending: Dr. "
             f"{rng.choice(lexicon('surnames')).capitalize()}\n\n")
    problems = list(patient.problems) + rng.sample(_lex(lexicons, "problems_bc5cdr"), 2)
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
    for x in rng.sample(_lex(lexicons, "tests"), 3):
        _entity(note, x, "test")
        note.add(f" {rng.choice(_RESULTS)}.\n")
    note.add("\nBRIEF HOSPITAL COURSE:\n")
    for _ in range(rng.randint(3, 6)):
        template = rng.choice(_COURSE)
        values = {"p": rng.choice(problems), "t": rng.choice(patient.treatments + list(
            rng.sample(_lex(lexicons, "treatments_bc5cdr"), 1))), "x": rng.choice(_lex(lexicons, "tests")),
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


# ------------------------------------------------------------------------------------------
# The hospital shape (``corpus.synthetic.shape: hospital``)
# ------------------------------------------------------------------------------------------

#: ``corpus.synthetic.shape`` values (module docstring).
SHAPES = ("fixed", "hospital")
#: Notes per patient of the hospital shape: round(exp(μ + s·Z)), Z ~ N(0, 1), clipped to
#: [1, HOSPITAL_MAX_NOTES]. The log-normal has median e^μ = 2.5 and mean e^(μ + s²/2) ≈ 6.2 before
#: rounding and the cap; P[exp(μ + s·Z) > 300] ≈ 2e-4 (a few patients per 10,000 at the cap).
#: MIMIC-III is heavier still (≈ 2.08M notes over ≈ 46.5k patients, mean ≈ 45, nursing and ECG
#: notes included): the shape keeps a real corpus's skew at a size two cores generate.
HOSPITAL_LOG_MEDIAN = math.log(2.5)
HOSPITAL_LOG_SPREAD = 1.3
HOSPITAL_MAX_NOTES = 300
HOSPITAL_NOTE_TYPES = ("discharge summary", "progress note", "nursing note", "radiology report")
#: The admissions of a patient (at most its notes): MIMIC-III has ≈ 58.9k admissions over ≈ 46.5k
#: patients (1.27 each); these weights give a mean of 1.32.
_ADMISSIONS = ((1, 80), (2, 12), (3, 5), (4, 2), (5, 1))
#: The types of a patient's notes other than each admission's discharge summary.
_OTHER_NOTES = (("progress note", 30), ("nursing note", 45), ("radiology report", 25))
_IMAGING = ("chest x-ray", "chest radiograph", "ct scan of the abdomen", "ct scan of the head", "mri of the brain",
            "echocardiogram", "transthoracic echocardiogram")
_FINDINGS = ("no acute cardiopulmonary process", "mild cardiomegaly", "small left pleural effusion",
             "bibasilar atelectasis", "no acute intracranial hemorrhage", "stable postoperative changes",
             "patchy right lower lobe opacity", "no free air", "moderate pulmonary edema")


def _hospital_rng(seed, patient: int) -> random.Random:
    """The patient's RNG: the corpus key ``"{seed}:{patient}"`` (module docstring)."""
    return random.Random(f"{seed}:{patient}")


def _draw_note_count(rng: random.Random) -> int:
    x = math.exp(HOSPITAL_LOG_MEDIAN + HOSPITAL_LOG_SPREAD * rng.gauss(0.0, 1.0))
    return max(1, min(HOSPITAL_MAX_NOTES, int(math.floor(x + 0.5))))


def hospital_note_count(patient: int, seed: int = 1234) -> int:
    """The number of notes patient ``patient`` has in the hospital-shaped corpus of ``seed`` (the
    first draw of its RNG: cheap, nothing is rendered)."""
    return _draw_note_count(_hospital_rng(seed, patient))


def _header(note: _Note, patient: _Patient, title: str, day: dt.date):
    name = f"{patient.first.capitalize()} {patient.last.capitalize()}"
    note.add(f"{title.upper()}\nName: {name}   MRN: {patient.mrn}   DOB: {patient.birth:%m/%d/%Y}\n"
             f"Date: {day:%m/%d/%Y}   Age: {(day - patient.birth).days // 365}   Sex: {patient.sex}\n\n")


def _render_progress(rng: random.Random, patient: _Patient, day: dt.date) -> _Note:
    note = _Note()
    _header(note, patient, "progress note", day)
    note.add("S: ")
    _entity(note, patient.problems[0], "problem")
    note.add(f" {rng.choice(['improving', 'unchanged', 'worse overnight'])}; "
             f"{rng.choice(['no new complaints', 'slept poorly', 'tolerating diet'])}.\n")
    note.add(f"O: T {rng.uniform(36.0, 39.0):.1f} HR {rng.randint(55, 120)} BP {rng.randint(95, 170)}/"
             f"{rng.randint(55, 95)} SpO2 {rng.randint(90, 100)}%. ")
    _entity(note, rng.choice(lexicon("tests")), "test")
    note.add(f" {rng.choice(_RESULTS)}.\nA/P:\n")
    for i, problem in enumerate(patient.problems[:rng.randint(2, 4)], start=1):
        note.add(f"{i}. ")
        _entity(note, problem, "problem")
        note.add(": continue ")
        _entity(note, rng.choice(patient.treatments), "treatment")
        note.add(f" {rng.choice(_DOSES)} {rng.choice(_ROUTES)} {rng.choice(_FREQ)}.\n")
    note.add(f"Dr. {rng.choice(lexicon('surnames')).capitalize()}\n")
    return note


def _render_nursing(rng: random.Random, patient: _Patient, day: dt.date) -> _Note:
    note = _Note()
    _header(note, patient, "nursing note", day)
    note.add(f"{rng.choice(['Day', 'Night'])} shift. Pt {patient.last.capitalize()} "
             f"{rng.choice(['alert and oriented x3', 'resting comfortably', 'anxious, reassured'])}. "
             f"Pain {rng.randint(0, 10)}/10. HR {rng.randint(55, 120)}, RR {rng.randint(12, 26)}, "
             f"SpO2 {rng.randint(90, 100)}% on {rng.choice(['ra', '2l nc'])}. "
             f"I/O {rng.randint(400, 2500)}/{rng.randint(300, 2200)} ml.\nGiven: ")
    _entity(note, rng.choice(patient.treatments), "treatment")
    note.add(" as ordered. Monitoring for ")
    _entity(note, rng.choice(patient.problems), "problem")
    note.add(f". {rng.choice(['Call light in reach.', 'Family at bedside.', 'Will continue to monitor.'])} "
             f"RN {rng.choice(lexicon('given_names')).capitalize()}\n")
    return note


def _render_radiology(rng: random.Random, patient: _Patient, day: dt.date) -> _Note:
    note = _Note()
    _header(note, patient, "radiology report", day)
    note.add("EXAM: ")
    _entity(note, rng.choice(_IMAGING), "test")
    note.add("\nINDICATION: ")
    _entity(note, rng.choice(patient.problems), "problem")
    note.add(f"\nFINDINGS: {rng.choice(_FINDINGS).capitalize()}. {rng.choice(_FINDINGS).capitalize()}.\n"
             f"IMPRESSION: {rng.choice(_FINDINGS).capitalize()}.\nRead by Dr. "
             f"{rng.choice(lexicon('surnames')).capitalize()}\n")
    return note


def _admission_plan(rng: random.Random, count: int) -> List[List[str]]:
    """The note types of each admission: one discharge summary closes each admission, the rest
    are spread over the admissions at random (types by :data:`_OTHER_NOTES`)."""
    admissions = min(count, rng.choices([a for a, _ in _ADMISSIONS], [w for _, w in _ADMISSIONS])[0])
    plan: List[List[str]] = [[] for _ in range(admissions)]
    kinds, weights = [t for t, _ in _OTHER_NOTES], [w for _, w in _OTHER_NOTES]
    for _ in range(count - admissions):
        plan[rng.randrange(admissions)].append(rng.choices(kinds, weights)[0])
    return [notes + ["discharge summary"] for notes in plan]


def _hospital_patient(index: int, seed) -> Iterator[Tuple[_Note, Document]]:
    """The notes of patient ``index`` of the hospital shape, in date order (a function of
    (seed, index) alone)."""
    rng = _hospital_rng(seed, index)
    count = _draw_note_count(rng)
    patient = _Patient(rng, index)
    admit = patient.birth + dt.timedelta(days=365 * rng.randint(25, 85) + rng.randrange(0, 365))
    renderers = {"progress note": _render_progress, "nursing note": _render_nursing,
                 "radiology report": _render_radiology}
    for a, types in enumerate(_admission_plan(rng, count)):
        stay = max(rng.randint(1, 12), len(types) // 8)
        discharge = admit + dt.timedelta(days=stay)
        admission_id = f"{patient.patient_id}-A{a}"
        days = sorted(rng.randint(0, stay) for _ in types[:-1])
        for n, kind in enumerate(types):
            if kind == "discharge summary":
                note = _render_note(rng, patient, admit, discharge, kind)
            else:
                note = renderers[kind](rng, patient, admit + dt.timedelta(days=days[n]))
            note_id = f"{admission_id}-N{n}"
            yield note, Document(doc_id=note_id, text=note.text(), patient_id=patient.patient_id,
                                 admission_id=admission_id, note_id=note_id)
        admit = discharge + dt.timedelta(days=rng.randint(30, 400))


def hospital_patient_facts(patient: int, seed: int = 1234) -> dict:
    """What every note of patient ``patient`` (hospital shape) agrees on: ``patient_id``, ``name``,
    ``mrn``, ``birth`` (date), ``sex``, ``problems`` and ``treatments`` (4 each: its chronic
    problems and drugs), ``notes`` (their number)."""
    rng = _hospital_rng(seed, patient)
    count = _draw_note_count(rng)
    p = _Patient(rng, patient)
    return {"patient_id": p.patient_id, "name": f"{p.first.capitalize()} {p.last.capitalize()}", "mrn": p.mrn,
            "birth": p.birth, "sex": p.sex, "problems": tuple(p.problems), "treatments": tuple(p.treatments),
            "notes": count}


def hospital_patient_notes(patient: int, seed: int = 1234) -> List[Document]:
    """Patient ``patient``'s notes in the hospital-shaped corpus of ``seed``, generated on demand
    (≤ :data:`HOSPITAL_MAX_NOTES`; no other patient is generated)."""
    if not isinstance(patient, int) or patient < 0:
        raise ValueError(f"patient must be an integer >= 0, got {patient!r}")
    return [document for _, document in _hospital_patient(patient, seed)]


def generate_hospital_notes(patients: int = 40, seed: int = 1234, start: int = 0) -> Iterator[Document]:
    """Stream the hospital-shaped corpus: patients ``start`` … ``start + patients − 1``, one patient's
    notes at a time (memory: one patient's ≤ :data:`HOSPITAL_MAX_NOTES` notes)."""
    if not isinstance(patients, int) or patients < 1:
        raise ValueError(f"patients must be an integer >= 1, got {patients!r}")
    for p in range(start, start + patients):
        for _, document in _hospital_patient(p, seed):
            yield document


def generate_hospital_labeled_notes(patients: int = 40, seed: int = 1234) -> Iterator[LabeledNote]:
    """The hospital-shaped corpus with word-level BIO tags (as :func:`generate_labeled_notes`)."""
    for p in range(patients):
        for note, document in _hospital_patient(p, seed):
            words, tags = note.words_and_tags()
            yield LabeledNote(document=document, words=tuple(words), tags=tuple(tags))


def corpus_notes(synthetic_config) -> Iterator[Document]:
    """The embedded corpus a ``dpbert.config.SyntheticCorpusConfig`` describes (its ``shape``)."""
    s = synthetic_config
    if s.shape == "hospital":
        return generate_hospital_notes(s.patients, s.seed)
    if s.shape != "fixed":
        raise ValueError(f"corpus.synthetic.shape must be one of {SHAPES}, got {s.shape!r}")
    return generate_notes(s.patients, s.admissions_per_patient, s.notes_per_admission, s.seed)


# ------------------------------------------------------------------------------------------
# The in-domain NER task (``ner.task: synthetic``)
# ------------------------------------------------------------------------------------------

#: The public seed of the NER task's fresh patients (stream ``"ner:{split}:{seed}:{patient}"``,
#: never a corpus key ``"{seed}:{patient}"``: module docstring).
NER_SEED = 20100
#: Default sizes: low-resource (a few hundred labelled sentences), as i2b2-2010's concept task is
#: for a new hospital, so that what pre-training put in the encoder matters.
NER_TRAIN_SENTENCES = 400
NER_TEST_SENTENCES = 400
#: Fraction of each entity lexicon held out of the training split (test sentences draw half their
#: entities from it).
NER_HELDOUT_FRACTION = 0.3
NER_SPLITS = ("train", "test")

#: Free-text clinical sentences: {p}/{q} problems, {t}/{u} treatments, {x}/{y} tests, {r} a result,
#: {n} a number, {d} a dose, {who} a relative — varied contexts (negation, orders, differentials,
#: abbreviations, allergies), so that an entity is recognised by its context, not its position.
_NER_TEMPLATES = (
    "pt c/o {p} x {n} days, denies {q}.",
    "{x} ordered to r/o {p}.",
    "no evidence of {p} on {x}.",
    "s/p {t} for {p}, tolerated well.",
    "{t} held due to {p}.",
    "will start {t} {d} and repeat {x} in am.",
    "family history significant for {p} in {who}.",
    "{p} resolved; {t} discontinued.",
    "ddx includes {p} vs {q}.",
    "{x} {r}, concerning for {p}.",
    "hx of {p}, on {t} at home.",
    "reports {p} after starting {t}.",
    "allergic to {t} (rash).",
    "discussed risks and benefits of {t} with patient and {who}.",
    "follow-up {x} in {n} weeks.",
    "negative for {p} and {q}.",
    "tolerated {t} without {p}.",
    "{x} and {y} were {r}.",
    "switched from {t} to {u} because of {p}.",
    "pt is a {n} yo with {p} and {q} on {t}.",
    "plan: {x}, continue {t}, monitor for {p}.",
    "consulted for worsening {p}; recommend {t} {d} and {x}.",
    "{p} likely secondary to {t}.",
    "the patient was given {t} {d} for {p} with improvement.",
    "repeat {x} showed {r} results.",
    "symptoms controlled with {t}; {x} pending.",
    "no {p}, no {q}.",
    "admitted with {p}, found to have {q} on {x}.",
    "{t} and {u} were restarted at discharge.",
    "r/o {p}: {x} and {y} sent.",
)
_NER_KINDS = {"p": "problem", "q": "problem", "t": "treatment", "u": "treatment", "x": "test", "y": "test"}
_RELATIVES = ("spouse", "daughter", "son", "mother", "father", "sister", "brother", "wife", "husband")


def _keyed_unit(*parts) -> float:
    """A public keyed hash of ``parts`` in [0, 1) (stable across processes and PYTHONHASHSEED)."""
    digest = hashlib.sha256(":".join(str(p) for p in parts).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2.0 ** 64


@lru_cache(maxsize=None)
def lexicon_split(name: str, part: str) -> Tuple[str, ...]:
    """The ``part`` (``train`` or ``heldout``) of lexicon ``name``: an entry is held out when a
    public keyed hash of it falls below :data:`NER_HELDOUT_FRACTION` (no entry in both parts)."""
    if part not in ("train", "heldout"):
        raise ValueError(f"part must be 'train' or 'heldout', got {part!r}")
    held = [e for e in lexicon(name) if _keyed_unit("ner-heldout", name, e) < NER_HELDOUT_FRACTION]
    return tuple(held) if part == "heldout" else tuple(e for e in lexicon(name) if e not in set(held))


def _typo(rng: random.Random, word: str) -> str:
    """One character dropped, doubled or two neighbours swapped (words of 4+ letters)."""
    if len(word) < 4 or not word.isalpha():
        return word
    i = rng.randrange(1, len(word) - 1)
    kind = rng.randrange(3)
    if kind == 0:
        return word[:i] + word[i + 1:]
    if kind == 1:
        return word[:i] + word[i] + word[i:]
    return word[:i - 1] + word[i] + word[i - 1] + word[i + 1:]


_SENTENCE_END = re.compile(r"(?<!Dr)(?<!Ms)\. ")


def _sentences_of(note: _Note) -> List[List[Tuple[str, Optional[str]]]]:
    """The note's pieces cut into sentences at line ends and at '. ' (entity pieces are never cut)."""
    out: List[List[Tuple[str, Optional[str]]]] = [[]]
    for text, entity in note.pieces:
        if entity is not None:
            out[-1].append((text, entity))
            continue
        for i, part in enumerate(_SENTENCE_END.sub(".\n", text).split("\n")):
            if i:
                out.append([])
            if part:
                out[-1].append((part, None))
    return [s for s in out if s]


def _entity_words(pieces, rng: random.Random, typo_rate: float) -> Tuple[List[str], List[str]]:
    words, tags = [], []
    for text, entity in pieces:
        for i, word in enumerate(split_words(text)):
            words.append(_typo(rng, word) if rng.random() < typo_rate else word)
            tags.append("O" if entity is None else ("B-" if i == 0 else "I-") + entity)
    return words, tags


def ner_sentences(split: str, sentences: int, seed: int = NER_SEED, typo_rate: float = 0.04
                  ) -> List[Tuple[Tuple[str, ...], Tuple[str, ...]]]:
    """``sentences`` (words, BIO tags) of the in-domain NER task's ``split`` (module docstring).

    Each fresh patient ``i`` of the split (stream ``"ner:{split}:{seed}:{i}"``) gives one rendered
    note, of which up to 3 sentences are kept (at least half of them with an entity), and 3
    free-text sentences (:data:`_NER_TEMPLATES`). Entities come from the split's lexicons:
    training part only for ``train``; for ``test`` each mention is drawn from the held-out part
    with probability 1/2. Words follow ``dpbert.data.words.split_words``; ``typo_rate`` of them
    get a typo (the tags are unchanged: a misspelt mention is still a mention)."""
    if split not in NER_SPLITS:
        raise ValueError(f"split must be one of {NER_SPLITS}, got {split!r}")
    if not isinstance(sentences, int) or sentences < 1:
        raise ValueError(f"sentences must be an integer >= 1, got {sentences!r}")
    train_lex = {name: lexicon_split(name, "train") for name in ENTITY_LEXICONS.values()}
    heldout_lex = {name: lexicon_split(name, "heldout") for name in ENTITY_LEXICONS.values()}
    out: List[Tuple[Tuple[str, ...], Tuple[str, ...]]] = []
    patient = 0
    while len(out) < sentences:
        rng = random.Random(f"ner:{split}:{seed}:{patient}")
        lexicons = train_lex if split == "train" or rng.random() < 0.5 else heldout_lex
        p = _Patient(rng, patient, lexicons)
        admit = p.birth + dt.timedelta(days=365 * rng.randint(25, 85) + rng.randrange(0, 365))
        note = _render_note(rng, p, admit, admit + dt.timedelta(days=rng.randint(1, 12)),
                            rng.choice(_NOTE_TYPES), lexicons)
        candidates = [s for s in _sentences_of(note) if len(split_words("".join(t for t, _ in s))) >= 3]
        with_entity = [s for s in candidates if any(e for _, e in s)]
        without = [s for s in candidates if not any(e for _, e in s)]
        chosen = rng.sample(with_entity, min(2, len(with_entity))) + rng.sample(without, min(1, len(without)))
        for _ in range(3):
            chosen.append(_template_sentence(rng, split, train_lex, heldout_lex))
        rng.shuffle(chosen)
        for pieces in chosen:
            words, tags = _entity_words(pieces, rng, typo_rate)
            if words and len(out) < sentences:
                out.append((tuple(words), tuple(tags)))
        patient += 1
    return out


def _template_sentence(rng: random.Random, split: str, train_lex, heldout_lex):
    template = rng.choice(_NER_TEMPLATES)
    pieces: List[Tuple[str, Optional[str]]] = []
    text = template
    while "{" in text:
        before, after = text.split("{", 1)
        key, text = after.split("}", 1)
        if before:
            pieces.append((before, None))
        if key in _NER_KINDS:
            kind = _NER_KINDS[key]
            lex = train_lex if split == "train" or rng.random() < 0.5 else heldout_lex
            pieces.append((rng.choice(lex[ENTITY_LEXICONS[kind]]), kind))
        elif key == "r":
            pieces.append((rng.choice(_RESULTS), None))
        elif key == "n":
            pieces.append((str(rng.randint(2, 90)), None))
        elif key == "d":
            pieces.append((f"{rng.choice(_DOSES)} {rng.choice(_ROUTES)} {rng.choice(_FREQ)}", None))
        else:
            pieces.append((rng.choice(_RELATIVES), None))
    if text:
        pieces.append((text, None))
    return pieces


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
