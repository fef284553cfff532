from dpbert.data.synthetic import ENTITY_TYPES, generate_labeled_notes, generate_notes, lexicon
from dpbert.data.words import split_words


def test_same_seed_same_notes_other_seed_other_notes():
    a = [d.text for d in generate_notes(patients=3, seed=1)]
    assert a == [d.text for d in generate_notes(patients=3, seed=1)]
    assert a != [d.text for d in generate_notes(patients=3, seed=2)]


def test_prefix_stability_across_corpus_sizes():
    small = list(generate_notes(patients=2, seed=5))
    big = list(generate_notes(patients=5, seed=5))
    assert big[: len(small)] == small


def test_structure_patients_admissions_ids_and_phi():
    docs = list(generate_notes(patients=4, admissions_per_patient=3, notes_per_admission=2, seed=0))
    assert len(docs) == 24
    assert len({d.patient_id for d in docs}) == 4 and len({d.admission_id for d in docs}) == 12
    assert len({d.doc_id for d in docs}) == 24
    text = docs[0].text
    for field in ("Name:", "MRN:", "DOB:", "HISTORY OF PRESENT ILLNESS", "ASSESSMENT AND PLAN"):
        assert field in text
    surnames = set(lexicon("surnames"))
    assert any(w in surnames for w in split_words(text))


def test_bio_labels_align_with_the_word_definition_and_cover_all_types():
    notes = list(generate_labeled_notes(patients=2, seed=3))
    for note in notes:
        assert list(note.words) == split_words(note.document.text)
        assert len(note.tags) == len(note.words)
        for prev, tag in zip(("O",) + note.tags, note.tags):
            if tag.startswith("I-"):
                assert prev[2:] == tag[2:], "I- tag must continue an entity of the same type"
    types = {t[2:] for n in notes for t in n.tags if t != "O"}
    assert types == set(ENTITY_TYPES)
