"""Word lists of the demo language: nouns, verbs, adjectives, adverbs and function words."""

# Nouns: "english[/irregular plural] German gender German-plural"; gender "mw" marks the
# weak masculine nouns, whose accusative and dative singular equal their plural.
ANIMATE = """man/men Mann m Männer; woman/women Frau f Frauen; child/children Kind n Kinder;
boy Junge mw Jungen; girl Mädchen n Mädchen; teacher Lehrer m Lehrer; doctor Arzt m Ärzte;
student Student mw Studenten; neighbour Nachbar mw Nachbarn; friend Freund m Freunde;
king König m Könige; soldier Soldat mw Soldaten; sister Schwester f Schwestern;
brother Bruder m Brüder; mother Mutter f Mütter; father Vater m Väter; baby Baby n Babys;
president Präsident mw Präsidenten; colleague Kollege mw Kollegen; tourist Tourist mw Touristen;
dog Hund m Hunde; cat Katze f Katzen; horse Pferd n Pferde; bird Vogel m Vögel;
mouse/mice Maus f Mäuse; fox Fuchs m Füchse; bear Bär mw Bären; lion Löwe mw Löwen;
monkey Affe mw Affen; rabbit Hase mw Hasen; elephant Elefant mw Elefanten; pig Schwein n Schweine;
duck Ente f Enten; wolf/wolves Wolf m Wölfe; snake Schlange f Schlangen"""
THINGS = """house Haus n Häuser; car Auto n Autos; book Buch n Bücher; table Tisch m Tische;
chair Stuhl m Stühle; door Tür f Türen; window Fenster n Fenster; apple Apfel m Äpfel;
letter Brief m Briefe; key Schlüssel m Schlüssel; bag Tasche f Taschen; box Kiste f Kisten;
cup Tasse f Tassen; glass Glas n Gläser; bottle Flasche f Flaschen; ball Ball m Bälle;
bed Bett n Betten; lamp Lampe f Lampen; picture Bild n Bilder; phone Telefon n Telefone;
computer Computer m Computer; shoe Schuh m Schuhe; hat Hut m Hüte; coat Mantel m Mäntel;
dress Kleid n Kleider; ship Schiff n Schiffe; train Zug m Züge; bus Bus m Busse;
bicycle Fahrrad n Fahrräder; flower Blume f Blumen; tree Baum m Bäume; cake Kuchen m Kuchen;
newspaper Zeitung f Zeitungen; gift Geschenk n Geschenke; game Spiel n Spiele;
knife/knives Messer n Messer; river Fluss m Flüsse; mountain Berg m Berge; city Stadt f Städte;
village Dorf n Dörfer; garden Garten m Gärten; park Park m Parks; street Straße f Straßen;
bridge Brücke f Brücken; school Schule f Schulen; church Kirche f Kirchen;
station Bahnhof m Bahnhöfe; shop Laden m Läden; room Zimmer n Zimmer; kitchen Küche f Küchen;
forest Wald m Wälder; lake See m Seen; hotel Hotel n Hotels; restaurant Restaurant n Restaurants;
library Bibliothek f Bibliotheken; castle Schloss n Schlösser"""
ADJECTIVES = """big groß; small klein; old alt; young jung; new neu; red rot; blue blau;
green grün; black schwarz; white weiß; yellow gelb; brown braun; long lang; short kurz;
fast schnell; slow langsam; happy glücklich; sad traurig; tired müde; beautiful schön; clean sauber;
dirty schmutzig; warm warm; cold kalt; heavy schwer; rich reich; strong stark; loud laut;
quiet leise; friendly freundlich; clever klug; hungry hungrig; strange seltsam; empty leer;
brave mutig; nice nett"""
# Verbs: "english[+particle] english-participle german[particle+stem] german-3rd-singular
# german-participle"; intransitive ones add their perfect auxiliary, h(aben) or s(ein).
TRANSITIVE = """see seen sehen sieht gesehen; find found finden findet gefunden;
buy bought kaufen kauft gekauft; sell sold verkaufen verkauft verkauft;
read read lesen liest gelesen; write written schreiben schreibt geschrieben;
love loved lieben liebt geliebt; hear heard hören hört gehört;
visit visited besuchen besucht besucht; need needed brauchen braucht gebraucht;
eat eaten essen isst gegessen; take taken nehmen nimmt genommen;
carry carried tragen trägt getragen; catch caught fangen fängt gefangen;
wash washed waschen wäscht gewaschen; paint painted malen malt gemalt;
open opened öffnen öffnet geöffnet; close closed schließen schließt geschlossen;
build built bauen baut gebaut; cook cooked kochen kocht gekocht; clean cleaned putzen putzt geputzt;
chase chased jagen jagt gejagt; meet met treffen trifft getroffen; know known kennen kennt gekannt;
forget forgotten vergessen vergisst vergessen; drink drunk trinken trinkt getrunken;
watch watched beobachten beobachtet beobachtet; call called an+rufen ruft angerufen;
invite invited ein+laden lädt eingeladen; pick+up picked ab+holen holt abgeholt;
put+on put an+ziehen zieht angezogen; take+off taken aus+ziehen zieht ausgezogen;
turn+on turned ein+schalten schaltet eingeschaltet;
turn+off turned aus+schalten schaltet ausgeschaltet;
bring+back brought zurück+bringen bringt zurückgebracht; tidy+up tidied auf+räumen räumt aufgeräumt;
throw+away thrown weg+werfen wirft weggeworfen"""
DITRANSITIVE = """give given geben gibt gegeben; show shown zeigen zeigt gezeigt;
send sent schicken schickt geschickt; bring brought bringen bringt gebracht;
offer offered an+bieten bietet angeboten"""
INTRANSITIVE = """sleep slept schlafen schläft geschlafen h; run run laufen läuft gelaufen s;
come come kommen kommt gekommen s; go gone gehen geht gegangen s;
swim swum schwimmen schwimmt geschwommen s; laugh laughed lachen lacht gelacht h;
wait waited warten wartet gewartet h; work worked arbeiten arbeitet gearbeitet h;
play played spielen spielt gespielt h; travel travelled reisen reist gereist s;
stay stayed bleiben bleibt geblieben s; fall fallen fallen fällt gefallen s;
arrive arrived an+kommen kommt angekommen s; get+up got auf+stehen steht aufgestanden s;
wake+up woken auf+wachen wacht aufgewacht s"""
REPORTING = """say said sagen sagt gesagt; think thought denken denkt gedacht;
know known wissen weiß gewusst; believe believed glauben glaubt geglaubt;
hope hoped hoffen hofft gehofft; hear heard hören hört gehört"""
# "english=german[=...]": time adverbs list the tenses they fit, (p)resent, per(f)ect or
# (m)odal; prepositions the case they govern.
TIME = """today=heute=pfm; now=jetzt=pm; every day=jeden Tag=pm; in the morning=am Morgen=pfm;
in the evening=am Abend=pfm; at night=in der Nacht=pfm; yesterday=gestern=f;
last week=letzte Woche=f; tomorrow=morgen=pm; soon=bald=pm; on Monday=am Montag=pfm;
on Friday=am Freitag=pfm; on Sunday=am Sonntag=pfm"""
FREQUENCY = """often=oft; always=immer; never=nie; rarely=selten; sometimes=manchmal;
usually=meistens; already=schon; also=auch"""
MANNER = """quickly=schnell; slowly=langsam; quietly=leise; carefully=vorsichtig; happily=fröhlich;
again=wieder; together=zusammen; alone=allein; well=gut; badly=schlecht"""
PREPOSITIONS = """with=mit=dat; in=in=dat; on=auf=dat; under=unter=dat; behind=hinter=dat;
next to=neben=dat; in front of=vor=dat; at=an=dat; from=von=dat; to=zu=dat; near=bei=dat;
after=nach=dat; without=ohne=acc; for=für=acc; through=durch=acc; around=um=acc;
against=gegen=acc"""
NUMBERS = """two=zwei; three=drei; four=vier; five=fünf; six=sechs; seven=sieben; eight=acht;
nine=neun; ten=zehn; eleven=elf; twelve=zwölf"""

COORDINATORS = (("and", ["und"], False), ("but", [",", "aber"], False), ("or", ["oder"], False),
                ("and then", ["und", "dann"], True))  # True: the next clause is verb-first
SUBORDINATORS = (("because", "weil"), ("although", "obwohl"), ("while", "während"),
                 ("when", "wenn"), ("if", "falls"), ("before", "bevor"), ("until", "bis"))
PRONOUNS = (("I", "ich", "1s"), ("he", "er", "3s"), ("she", "sie", "3s"), ("we", "wir", "1p"),
            ("they", "sie", "3p"))
# Determiners: (weight, declension, English, German stem).
SG_DETS = ((0.5, "def", "the", ""), (0.22, "ein", "a", "ein"), (0.08, "dies", "this", "dies"),
           (0.04, "ein", "my", "mein"), (0.03, "ein", "his", "sein"), (0.03, "ein", "her", "ihr"),
           (0.03, "ein", "our", "unser"), (0.03, "ein", "their", "ihr"),
           (0.04, "ein", "no", "kein"))
PL_DETS = ((0.34, "def", "the", ""), (0.08, "dies", "these", "dies"), (0.04, "ein", "my", "mein"),
           (0.03, "ein", "our", "unser"), (0.03, "ein", "their", "ihr"),
           (0.03, "ein", "no", "kein"), (0.25, "num", "", ""), (0.20, "none", "", ""))
CONTRACTIONS = {("in", "dem"): "im", ("an", "dem"): "am", ("zu", "dem"): "zum",
                ("zu", "der"): "zur", ("bei", "dem"): "beim", ("von", "dem"): "vom"}
IRREGULAR = """haben habe hat haben; sein bin ist sind; können kann kann können;
müssen muss muss müssen; dürfen darf darf dürfen; wollen will will wollen;
wissen weiß weiß wissen"""
