"""Summary templates: a news-like article (one passage, 4-8 sentences) and a short summary.

The question is ``None`` (the prompt asks for a summary). Each template varies its
sentence order and optional sentences, and the summary picks the key facts as slots
(see :mod:`tools.corpus.compose`).
"""

from __future__ import annotations

from collections.abc import Callable

from tools.corpus.compose import Doc, Gen, Part, a_an, fdate, fnum


def _doc(g: Gen, sentences: list[str], response: list[Part], *, shuffle_tail: int = 0) -> Doc:
    """Join an article; the last ``shuffle_tail`` sentences (background) come in random order."""
    if shuffle_tail:
        tail = sentences[-shuffle_tail:]
        g.rng.shuffle(tail)
        sentences = sentences[:-shuffle_tail] + tail
    return Doc(passages=(" ".join(sentences),), question=None, response=tuple(response))


def bridge_reopens(g: Gen) -> Doc:
    """A bridge reopening after repairs: date, duration, contractor, cost, traffic."""
    town, river, firm, eng = g.town(), g.fresh("river"), g.company(), g.person()
    d = g.date(2016, 2025)
    months, cost, cars = g.int(5, 30), g.real(1.5, 48.0), g.int(6, 45) * 1000
    y = g.int(1880, 1975)
    s = [
        f"The {town} Bridge over the River {river} reopened to traffic on {fdate(d, 'wdm')} after {months} months of repairs.",
        f"The work, carried out by {firm}, cost {cost:.1f} million crowns and replaced the steel deck and all of the bridge's bearings.",
        f"About {fnum(cars, 'comma')} vehicles cross the bridge each day, and its closure forced drivers onto a long detour through the hills.",
        f"Lead engineer {eng} said the bridge, first opened in {y}, should now last another fifty years.",
        "A weight limit for lorries will remain in place until the road surface has settled.",
        "Local shopkeepers said trade had already begun to recover.",
    ]
    r: list[Part] = [
        "The ",
        g.ent(town, "town"),
        " Bridge reopened on ",
        g.when(d, "wdm"),
        " after ",
        g.num(months),
        " months of repairs by ",
        g.ent(firm, "company"),
        " costing ",
        g.num(cost, "1f"),
        " million crowns",
        g.add(
            detail=[", paid for by a national road fund"],
            baseless=[", well over the original estimate"],
        ),
        ". About ",
        g.num(cars, "comma"),
        " vehicles use it daily, and a weight limit for lorries ",
        g.flip("will remain in place for now", "has been lifted"),
        ".",
        g.add(
            detail=[" The repairs were overseen by the regional roads agency."],
            baseless=[" The closure had badly hurt local businesses."],
        ),
    ]
    return _doc(g, s, r, shuffle_tail=2)


def acquisition(g: Gen) -> Doc:
    """A company takeover: buyer, target, price, premium, jobs, regulatory approval."""
    buyer, target, ceo = g.company(), g.company(), g.person()
    price, staff, pct = g.int(40, 900), g.int(2, 60) * 50, g.int(8, 45)
    d = g.date(2018, 2025)
    town = g.town()
    s = [
        f"{buyer} has agreed to buy its smaller rival {target} for {price} million euros, the companies announced on {fdate(d, 'dmy')}.",
        f"{target}, based in {town}, employs {fnum(staff, 'comma')} people and makes parts for the farming industry.",
        f"The price is {pct} percent above what investors valued the company at last month.",
        f"{buyer} chief executive {ceo} said all sites of the smaller company would stay open.",
        "The deal still needs approval from competition regulators, which could take several months.",
        f"Shares in {buyer} were little changed after the announcement.",
    ]
    r: list[Part] = [
        g.ent(buyer, "company"),
        " has agreed to buy ",
        g.ent(target, "company"),
        " for ",
        g.num(price),
        " million euros, a premium of ",
        g.num(pct, hi=99),
        " percent",
        g.add(detail=[", paid in cash and shares"], baseless=[", which suggests a bidding war"]),
        ". The deal was announced on ",
        g.when(d, "dmy"),
        " and ",
        g.flip("still needs regulatory approval", "has already been cleared by regulators"),
        ". ",
        ceo,
        " said all sites and the ",
        g.num(staff, "comma"),
        " jobs in ",
        g.ent(town, "town"),
        " would be kept.",
        g.add(
            detail=[" Completion is expected by the end of next year."],
            baseless=[" The merger will make it the market leader."],
        ),
    ]
    return _doc(g, s, r, shuffle_tail=1)


def cup_final(g: Gen) -> Doc:
    """A cup final report: score, date, scorer, crowd, years without a trophy."""
    a, b, town = g.fresh("club"), g.fresh("club"), g.town()
    ga, gb = g.int(2, 4), g.int(0, 1)
    star, coach = g.person(), g.person()
    crowd = g.int(8, 60) * 500
    d = g.date(2012, 2025)
    years = g.int(5, 40)
    s = [
        f"{a} won the regional cup final on {fdate(d, 'dmy')}, beating {b} {ga}-{gb} at the stadium in {town}.",
        f"A crowd of {fnum(crowd, 'comma')} watched {star} score twice in the second half.",
        f"It is the club's first trophy in {years} years.",
        f"{b} kept the game level until half-time, but lost their goalkeeper to injury early in the second half.",
        f"Coach {coach} dedicated the win to the club's volunteers.",
        "The two sides meet again in the league next month.",
    ]
    r: list[Part] = [
        g.ent(a, "club"),
        " ",
        g.flip("beat", "lost to"),
        " ",
        g.ent(b, "club"),
        " ",
        g.num(ga),
        "-",
        g.num(gb, lo=0),
        " in the regional cup final on ",
        g.when(d, "dmy"),
        ", their first trophy in ",
        g.num(years),
        " years. ",
        g.ent(star, "person"),
        " scored twice",
        g.add(detail=[", including a penalty"], baseless=[", underlining a superb season"]),
        " in front of ",
        g.num(crowd, "comma"),
        " fans.",
        g.add(
            detail=[f" The match was refereed by {g.person()}."],
            baseless=[" The win was fully deserved."],
        ),
    ]
    return _doc(g, s, r, shuffle_tail=2)


def fossil_find(g: Gen) -> Doc:
    """A fossil discovery: finder, date, age, size, expert, university."""
    finder, expert, uni = g.person(), g.person(), g.fresh("university")
    town = g.town()
    myears, length = g.int(70, 420), g.real(0.3, 9.0)
    d = g.date(2015, 2025)
    kind = g.pick(
        (
            "a marine reptile",
            "an early fish",
            "a giant insect",
            "a flying reptile",
            "a plant-eating dinosaur",
        )
    )
    s = [
        f"A student hiking near {town} has found the fossil of {kind} that lived about {myears} million years ago.",
        f"{finder} spotted part of the skeleton in a cliff face on {fdate(d, 'dmy')} and reported it to the {uni}.",
        f"Palaeontologist {expert} said the animal was about {length:.1f} metres long.",
        "It is the most complete find of its kind in the country.",
        "The fossil will be cleaned and studied before going on display.",
        "Experts warned the public not to dig at the site, which is on private land.",
    ]
    r: list[Part] = [
        g.ent(finder, "person"),
        " found the fossil of ",
        kind,
        " near ",
        g.ent(town, "town"),
        " on ",
        g.when(d, "dmy"),
        ". The animal lived about ",
        g.num(myears),
        " million years ago and was about ",
        g.num(length, "1f"),
        " metres long, according to ",
        g.ent(expert, "person"),
        " of the ",
        g.ent(uni, "university"),
        g.add(
            detail=[", who has studied the cliffs for a decade"],
            baseless=[", which could change how scientists see the period"],
        ),
        ". The public is asked ",
        g.flip("not to dig at the site", "to help dig at the site"),
        ".",
        g.add(
            detail=[" It will go on display next spring."],
            baseless=[" It is likely to become a major attraction."],
        ),
    ]
    return _doc(g, s, r, shuffle_tail=2)


def storm(g: Gen) -> Doc:
    """A storm: date, gusts, homes without power, closed schools, injuries."""
    name = g.pick(("Agnes", "Bram", "Corin", "Delia", "Edvin", "Freya", "Gorm", "Hilde"))
    region, town = g.fresh("region"), g.town()
    wind, homes, schools = g.int(90, 180), g.int(2, 90) * 500, g.int(12, 140)
    d = g.date(2014, 2025)
    official = g.person()
    s = [
        f"Storm {name} swept across {region} on {fdate(d, 'wdm')}, with gusts of up to {wind} kilometres an hour.",
        f"Around {fnum(homes, 'comma')} homes lost power, most of them in and around {town}.",
        f"{schools} schools stayed closed the following day as crews cleared fallen trees from roads.",
        f"Regional emergency chief {official} said nobody had been seriously hurt.",
        "Ferries were cancelled and the coastal railway was shut for several hours.",
        "Forecasters expect calmer weather by the weekend.",
    ]
    r: list[Part] = [
        "Storm ",
        name,
        " hit ",
        g.ent(region, "region"),
        " on ",
        g.when(d, "wdm"),
        " with gusts of up to ",
        g.num(wind),
        " km/h, cutting power to about ",
        g.num(homes, "comma"),
        " homes",
        g.add(detail=[" for up to two days"], baseless=[", the worst damage in years"]),
        ". ",
        g.num(schools),
        " schools closed the next day, and according to ",
        g.ent(official, "person"),
        " ",
        g.flip("nobody was seriously hurt", "several people were seriously hurt"),
        ".",
        g.add(
            detail=[f" Damage is estimated at {g.int(3, 60)} million crowns."],
            baseless=[" Climate change is making such storms more common."],
        ),
    ]
    return _doc(g, s, r, shuffle_tail=2)


def referendum(g: Gen) -> Doc:
    """A merger referendum: result, date, share in favour, turnout, mayor."""
    a, b = g.town(), g.town()
    yes = g.int(31, 69)
    turnout = g.int(35, 78)
    d = g.date(2012, 2025)
    mayor = g.person()
    merge = yes > 50
    s = [
        f"Voters in {a} have {'approved' if merge else 'rejected'} a proposal to merge the town with neighbouring {b}.",
        f"In the referendum on {fdate(d, 'dmy')}, {yes} percent voted in favour, on a turnout of {turnout} percent.",
        "Supporters had argued that a merger would save money on schools and rubbish collection.",
        f"Opponents feared that {a} would lose its own council and its voice in regional affairs.",
        f"Mayor {mayor} said the council would {'start talks with' if merge else 'respect the result and keep working with'} {b}.",
        "A similar vote was held twenty years ago.",
    ]
    r: list[Part] = [
        "Voters in ",
        g.ent(a, "town"),
        " ",
        g.flip("approved", "rejected") if merge else g.flip("rejected", "approved"),
        " a merger with ",
        g.ent(b, "town"),
        " in a referendum on ",
        g.when(d, "dmy"),
        ", with ",
        g.num(yes, hi=99),
        " percent in favour and turnout of ",
        g.num(turnout, hi=99),
        " percent",
        g.add(
            detail=[", slightly higher than at the last local election"],
            baseless=[", showing how divided the town is"],
        ),
        ". Mayor ",
        g.ent(mayor, "person"),
        " said the council would ",
        "start talks with " if merge else "keep working with ",
        b,
        ".",
        g.add(
            detail=[" A second vote is planned in two years."],
            baseless=[" The result is a blow to the regional government."],
        ),
    ]
    return _doc(g, s, r)


def product_launch(g: Gen) -> Doc:
    """A product launch: maker, sale date, price, weight, run time, factory."""
    co, ceo = g.company(), g.person()
    prod = g.fresh("product")
    kind = g.pick(
        (
            "electric cargo bike",
            "home battery",
            "robot lawnmower",
            "folding kayak",
            "smart thermostat",
        )
    )
    price, rng_, kg = g.int(3, 40) * 100, g.int(30, 160), g.real(8.0, 60.0)
    d = g.date(2019, 2026)
    s = [
        f"{co} has unveiled the {prod}, {a_an(kind)} that will go on sale on {fdate(d, 'md')}.",
        f"It will cost {fnum(price, 'comma')} euros and weighs {kg:.1f} kilograms.",
        f"The company says it can run for {rng_} hours between charges, more than any earlier model.",
        f"Chief executive {ceo} said production would take place in the company's existing factory.",
        "The launch comes after two years of development and a delayed test programme.",
        "Pre-orders open next week on the company's website.",
    ]
    r: list[Part] = [
        g.ent(co, "company"),
        " has unveiled the ",
        g.ent(prod, "product"),
        ", ",
        a_an(kind),
        " going on sale on ",
        g.when(d, "md"),
        " for ",
        g.num(price, "comma"),
        " euros. It weighs ",
        g.num(kg, "1f"),
        " kilograms and runs for ",
        g.num(rng_),
        " hours per charge",
        g.add(
            detail=[", with a two-year warranty"],
            baseless=[", which should appeal to first-time buyers"],
        ),
        ". It will be made in the company's ",
        g.flip("existing factory", "new factory"),
        ".",
        g.add(
            detail=[" It will first be sold in three countries."],
            baseless=[" Demand is expected to be strong."],
        ),
    ]
    return _doc(g, s, r, shuffle_tail=2)


def art_theft(g: Gen) -> Doc:
    """A painting stolen from a gallery: painter, title, year, value, reward."""
    town = g.town()
    museum = f"{town} Gallery"
    painter = g.person()
    work = g.fresh("title")
    y, value, reward = g.int(1620, 1930), g.real(0.4, 12.0), g.int(5, 80) * 1000
    d = g.date(2010, 2025)
    inspector = g.person()
    s = [
        f"A painting by {painter} has been stolen from the {museum}, police said on {fdate(d, 'dmy')}.",
        f"The work, {work}, was painted in {y} and is valued at about {value:.1f} million euros.",
        "Thieves entered through a skylight at night and disabled one of the alarms.",
        f"Inspector {inspector} said the painting has not yet been found and appealed for witnesses.",
        f"The gallery has offered a reward of {fnum(reward, 'comma')} euros for information.",
        "The gallery will stay closed for the rest of the week.",
    ]
    r: list[Part] = [
        g.ent(painter, "person"),
        "'s ",
        g.ent(work, "title"),
        ", painted in ",
        g.when(y),
        " and worth about ",
        g.num(value, "1f"),
        " million euros, was stolen from the ",
        g.ent(town, "town"),
        " Gallery",
        g.add(detail=[" by two men"], baseless=[" in what appears to be a theft to order"]),
        ". Police announced it on ",
        g.when(d, "dmy"),
        "; the painting ",
        g.flip("has not been found", "has since been recovered"),
        ", and a reward of ",
        g.num(reward, "comma"),
        " euros is offered.",
        g.add(
            detail=[" Security footage shows a dark van."],
            baseless=[" Insiders may have helped the thieves."],
        ),
    ]
    return _doc(g, s, r, shuffle_tail=1)


def school_funding(g: Gen) -> Doc:
    """A school modernisation plan: budget, schools, start year, new teachers."""
    region, official = g.fresh("region"), g.person()
    mil, schools, teachers = g.real(2.0, 60.0), g.int(12, 140), g.int(20, 400)
    y = g.int(2020, 2028)
    subject = g.pick(
        (
            "science laboratories",
            "school libraries",
            "sports halls",
            "music rooms",
            "computer rooms",
        )
    )
    s = [
        f"The education board of {region} will spend {mil:.1f} million crowns modernising {subject}.",
        f"The money will reach {schools} schools over the next three years, starting in {y}.",
        f"The board will also hire {teachers} new teachers, board chair {official} announced.",
        "Parents' groups welcomed the plan but said it came late.",
        "Several schools have not been renovated since the 1970s.",
        "The board will publish a list of the first schools in the spring.",
    ]
    r: list[Part] = [
        "The education board of ",
        g.ent(region, "region"),
        " will spend ",
        g.num(mil, "1f"),
        " million crowns on ",
        subject,
        " in ",
        g.num(schools),
        " schools from ",
        g.when(y),
        g.add(
            detail=[", funded by a new property tax"],
            baseless=[", a response to falling exam results"],
        ),
        ", and will hire ",
        g.num(teachers),
        " teachers, said chair ",
        g.ent(official, "person"),
        ". Parents' groups ",
        g.flip("welcomed the plan", "opposed the plan"),
        ".",
        g.add(
            detail=[" Rural schools will be served first."],
            baseless=[" The plan should ease teacher shortages."],
        ),
    ]
    return _doc(g, s, r, shuffle_tail=2)


def fare_change(g: Gen) -> Doc:
    """A bus fare rise: old and new fare, date, pass increase, exemptions."""
    town, op = g.town(), g.company()
    old = g.real(1.5, 3.5, 2)
    new = round(old + g.pick_any((0.1, 0.2, 0.25, 0.3, 0.4, 0.5)), 2)
    d = g.date(2017, 2026)
    pct = g.int(3, 12)
    boss = g.person()
    s = [
        f"Bus fares in {town} will rise from {old:.2f} to {new:.2f} euros on {fdate(d, 'dmy')}, the operator {op} said.",
        f"Monthly passes will go up by {pct} percent.",
        "Pensioners and children under twelve will continue to travel free.",
        f"Managing director {boss} blamed higher fuel and wage costs.",
        "Passenger groups criticised the increase, the second in three years.",
        "The company plans to add evening services on two routes.",
    ]
    r: list[Part] = [
        g.ent(op, "company"),
        " will raise single bus fares in ",
        g.ent(town, "town"),
        " from ",
        g.num(old, "2f"),
        " to ",
        g.num(new, "2f"),
        " euros on ",
        g.when(d, "dmy"),
        ", and monthly passes by ",
        g.num(pct, hi=99),
        " percent",
        g.add(
            detail=[", the first rise since the pandemic"],
            baseless=[", which will hit low-income commuters hardest"],
        ),
        ". ",
        g.ent(boss, "person"),
        " blamed fuel and wage costs; pensioners and young children ",
        g.flip("will still travel free", "will now have to pay"),
        ".",
        g.add(
            detail=[" Ticket machines will be replaced in the autumn."],
            baseless=[" Ridership is likely to fall."],
        ),
    ]
    return _doc(g, s, r, shuffle_tail=2)


def factory_closure(g: Gen) -> Doc:
    """A factory closure: date, jobs, opening year, new site, union reaction."""
    co, town, union_rep = g.company(), g.town(), g.person()
    jobs = g.int(6, 90) * 10
    d = g.date(2016, 2026)
    y = g.int(1950, 1995)
    moved = g.town()
    s = [
        f"{co} will close its factory in {town} by {fdate(d, 'month_year')}, with the loss of {jobs} jobs.",
        f"Production will move to the company's larger plant in {moved}.",
        f"The factory opened in {y} and was once the town's biggest employer.",
        f"Union representative {union_rep} called the decision a heavy blow and said workers would seek better redundancy terms.",
        "The company said some staff would be offered jobs at the other plant.",
        "The town council has asked for talks with the company.",
    ]
    r: list[Part] = [
        g.ent(co, "company"),
        " will close its ",
        g.ent(town, "town"),
        " factory, open since ",
        g.when(y),
        ", by ",
        g.when(d, "month_year"),
        ", cutting ",
        g.num(jobs),
        " jobs and moving production to ",
        g.ent(moved, "town"),
        g.add(
            detail=[" to save about 12 million euros a year"],
            baseless=[" as demand for its products declines"],
        ),
        ". Union representative ",
        union_rep,
        " ",
        g.flip("criticised the decision", "welcomed the decision"),
        ", and some staff ",
        g.flip("will be offered jobs at the other plant", "will not be offered other jobs"),
        ".",
        g.add(
            detail=[" The site will be sold for housing."],
            baseless=[" The closure will hit local shops hard."],
        ),
    ]
    return _doc(g, s, r, shuffle_tail=1)


def charity_run(g: Gen) -> Doc:
    """A charity marathon: runners, money raised, winner's time, next year's route."""
    town, winner, charity = (
        g.town(),
        g.person(),
        g.pick(
            (
                "a children's hospice",
                "the lifeboat service",
                "a food bank",
                "a hearing research fund",
            )
        ),
    )
    runners, raised = g.int(4, 90) * 100, g.int(20, 900) * 1000
    hh, mm = g.int(2, 3), g.int(2, 58)
    d = g.date(2014, 2025)
    s = [
        f"More than {fnum(runners, 'comma')} people took part in the {town} charity marathon on {fdate(d, 'dmy')}.",
        f"The event raised {fnum(raised, 'comma')} euros for {charity}, a record for the race.",
        f"{winner} won the men's race in {hh} hours {mm} minutes.",
        "Many runners wore fancy dress, and a group of firefighters ran in full uniform.",
        "Organisers thanked the hundreds of volunteers who staffed water stations along the route.",
        "Next year's race will follow a new route along the seafront.",
    ]
    r: list[Part] = [
        "More than ",
        g.num(runners, "comma"),
        " people ran the ",
        g.ent(town, "town"),
        " charity marathon on ",
        g.when(d, "dmy"),
        ", raising a record ",
        g.num(raised, "comma"),
        " euros for ",
        charity,
        g.add(
            detail=[", with matching funds from a local bank"],
            baseless=[", thanks largely to social media"],
        ),
        ". ",
        g.ent(winner, "person"),
        " won the men's race in ",
        g.num(hh),
        " hours ",
        g.num(mm),
        " minutes, and next year the route ",
        g.flip("will change", "will stay the same"),
        ".",
        g.add(
            detail=[" The women's race was won by a debutant."],
            baseless=[" The race is becoming one of the region's biggest events."],
        ),
    ]
    return _doc(g, s, r, shuffle_tail=2)


def wildlife_count(g: Gen) -> Doc:
    """A wildlife census: count, earlier count, trend, organiser, cause."""
    animal = g.pick(
        ("grey seals", "otters", "beavers", "white storks", "red squirrels", "natterjack toads")
    )
    region, lead, group = g.fresh("region"), g.person(), g.fresh("trust")
    now, before = g.int(120, 4000), 0
    rose = g.chance(0.6)
    delta = g.int(8, 45)
    before = round(now / (1 + delta / 100)) if rose else round(now / (1 - delta / 100))
    y = g.int(2015, 2025)
    s = [
        f"A survey in {y} counted {fnum(now, 'comma')} {animal} in {region}, {'up' if rose else 'down'} from {fnum(before, 'comma')} five years earlier.",
        f"The count was organised by {group} and carried out by more than 200 volunteers.",
        f"Project leader {lead} said {'cleaner rivers and new protected areas had helped' if rose else 'the loss of wetland habitat was the main cause'}.",
        "The survey is repeated every five years.",
        "Volunteers used drones for the first time to count animals in hard-to-reach areas.",
    ]
    r: list[Part] = [
        "The ",
        g.when(y),
        " survey by ",
        g.ent(group, "trust"),
        " counted ",
        g.num(now, "comma"),
        " ",
        animal,
        " in ",
        g.ent(region, "region"),
        ", ",
        g.flip("up", "down") if rose else g.flip("down", "up"),
        " from ",
        g.num(before, "comma"),
        " five years earlier",
        g.add(
            detail=[
                ", the highest figure since records began"
                if rose
                else ", the lowest figure since records began"
            ],
            baseless=[", a trend likely to continue"],
        ),
        ". Project leader ",
        g.ent(lead, "person"),
        " linked the change to ",
        "cleaner rivers and new protected areas." if rose else "the loss of wetland habitat.",
        g.add(
            detail=[" The next count will include two neighbouring regions."],
            baseless=[" Farmers' changing practices also played a part."],
        ),
    ]
    return _doc(g, s, r, shuffle_tail=2)


def court_ruling(g: Gen) -> Doc:
    """A pollution fine: court, company, amount, judge, households, appeal."""
    co, judge, town = g.company(), g.person(), g.town()
    fine, households = g.int(2, 90) * 10000, g.int(40, 900)
    d = g.date(2015, 2025)
    appeal = g.chance(0.5)
    s = [
        f"A court in {town} has fined {co} {fnum(fine, 'comma')} euros for polluting a stream with waste water.",
        f"Judge {judge} said on {fdate(d, 'dmy')} that the company had ignored repeated warnings from inspectors.",
        f"{households} households downstream were told not to use well water for several weeks last year.",
        "The company must also pay for cleaning the stream bed.",
        (
            "The company said it would appeal."
            if appeal
            else "The company said it accepted the ruling and would not appeal."
        ),
        "Environmental groups called the fine too small.",
    ]
    r: list[Part] = [
        "A ",
        g.ent(town, "town"),
        " court fined ",
        g.ent(co, "company"),
        " ",
        g.num(fine, "comma"),
        " euros on ",
        g.when(d, "dmy"),
        " for polluting a stream",
        g.add(
            detail=[" with chemicals from its paint shop"],
            baseless=[", a warning to other firms in the area"],
        ),
        ". Judge ",
        g.ent(judge, "person"),
        " said the company ignored inspectors' warnings; ",
        g.num(households),
        " households had to avoid well water. The company ",
        g.flip("plans to appeal", "will not appeal")
        if appeal
        else g.flip("will not appeal", "plans to appeal"),
        ".",
        g.add(
            detail=[" It has since replaced its filters."],
            baseless=[" The case has damaged its reputation."],
        ),
    ]
    return _doc(g, s, r, shuffle_tail=1)


def nurses_strike(g: Gen) -> Doc:
    """A nurses' strike: days, start date, demand, offer, emergency care."""
    region, rep, minister = g.fresh("region"), g.person(), g.person()
    days, pct, offer = g.int(2, 7), g.int(6, 15), 0
    offer = g.int(2, pct - 2)
    nurses = g.int(4, 40) * 500
    d = g.date(2016, 2026)
    s = [
        f"Nurses in {region} will strike for {days} days from {fdate(d, 'dmy')}, their union has announced.",
        f"About {fnum(nurses, 'comma')} nurses are expected to take part.",
        f"The union is demanding a pay rise of {pct} percent; the regional health department has offered {offer} percent.",
        f"Union spokesperson {rep} said emergency care would not be affected.",
        f"Health minister {minister} called the strike regrettable and said talks would continue.",
        "Planned operations will be postponed during the strike.",
    ]
    r: list[Part] = [
        "About ",
        g.num(nurses, "comma"),
        " nurses in ",
        g.ent(region, "region"),
        " will strike for ",
        g.num(days),
        " days from ",
        g.when(d, "dmy"),
        ", seeking a pay rise of ",
        g.num(pct),
        " percent against an offer of ",
        g.num(offer),
        " percent",
        g.add(
            detail=[", the first strike in a decade"],
            baseless=[", a gap that is unlikely to close soon"],
        ),
        ". Spokesperson ",
        g.ent(rep, "person"),
        " said emergency care ",
        g.flip("will not be affected", "will be affected"),
        ", while planned operations will be postponed.",
        g.add(
            detail=[" Further strikes are planned for the autumn."],
            baseless=[" Public opinion is on the nurses' side."],
        ),
    ]
    return _doc(g, s, r, shuffle_tail=1)


def festival_report(g: Gen) -> Doc:
    """A festival review: visitors, last year's figure, stages, closing act."""
    town, act, boss = g.town(), g.person(), g.person()
    visitors, prev, stages = g.int(20, 120) * 1000, 0, g.int(3, 12)
    prev = visitors - g.int(2, 15) * 1000
    d = g.date(2014, 2025)
    s = [
        f"The {town} summer festival ended on {fdate(d, 'dm')} with a record {fnum(visitors, 'comma')} visitors, up from {fnum(prev, 'comma')} last year.",
        f"Crowds packed the {stages} stages for four days of music, theatre and food.",
        f"The closing concert by {act} drew the biggest audience of the weekend.",
        f"Festival director {boss} said the event had been sold out for the first time.",
        "Police reported few incidents.",
        "Organisers are already planning an extra day next year.",
    ]
    r: list[Part] = [
        "The ",
        g.ent(town, "town"),
        " summer festival, which ended on ",
        g.when(d, "dm"),
        ", drew a record ",
        g.num(visitors, "comma"),
        " visitors, up from ",
        g.num(prev, "comma"),
        ", across ",
        g.num(stages),
        " stages",
        g.add(detail=[", with tickets from 60 euros"], baseless=[", boosted by the fine weather"]),
        ". ",
        g.ent(act, "person"),
        " closed the festival, which ",
        g.flip("sold out", "did not sell out"),
        " for the first time, according to ",
        g.ent(boss, "person"),
        ".",
        g.add(
            detail=[" An extra stage for children was added this year."],
            baseless=[" The festival is now the biggest in the region."],
        ),
    ]
    return _doc(g, s, r, shuffle_tail=2)


def tourism_figures(g: Gen) -> Doc:
    """Tourism statistics: overnight stays, change, year, foreign share, reasons."""
    region, official = g.fresh("region"), g.person()
    stays, pct = g.real(1.2, 9.8), g.int(3, 28)
    y = g.int(2015, 2025)
    share = g.int(18, 55)
    up = g.chance(0.6)
    s = [
        f"Hotels and campsites in {region} recorded {stays:.1f} million overnight stays in {y}, {'an increase' if up else 'a decrease'} of {pct} percent on the previous year.",
        f"Visitors from abroad accounted for {share} percent of all stays.",
        f"Tourism board director {official} said {'new cycling routes and a mild autumn' if up else 'poor summer weather and fewer flights'} explained the change.",
        "Coastal towns did better than the inland areas.",
        "The board will spend more on marketing next year.",
    ]
    r: list[Part] = [
        "Overnight stays in ",
        g.ent(region, "region"),
        " ",
        g.flip("rose", "fell") if up else g.flip("fell", "rose"),
        " by ",
        g.num(pct, hi=99),
        " percent to ",
        g.num(stays, "1f"),
        " million in ",
        g.when(y),
        g.add(
            detail=[", with campsites doing best"],
            baseless=[
                ", a sign the region's reputation is growing"
                if up
                else ", a sign the region is losing its appeal"
            ],
        ),
        ". Foreign visitors made up ",
        g.num(share, hi=99),
        " percent of stays, and director ",
        g.ent(official, "person"),
        " pointed to ",
        "new cycling routes and a mild autumn." if up else "poor summer weather and fewer flights.",
        g.add(
            detail=[" Average stays lasted four nights."], baseless=[" Hotel prices also went up."]
        ),
    ]
    return _doc(g, s, r, shuffle_tail=2)


def archaeology_dig(g: Gen) -> Doc:
    """A coin hoard: team, coins, century, announcement date, dig length."""
    town, lead, uni = g.town(), g.person(), g.fresh("university")
    coins, century, weeks = (
        g.int(30, 900),
        g.pick(("ninth", "tenth", "eleventh", "twelfth", "thirteenth")),
        g.int(3, 14),
    )
    d = g.date(2014, 2025)
    s = [
        f"Archaeologists digging near {town} have found a hoard of {coins} silver coins from the {century} century.",
        f"The coins were buried in a clay pot beneath the floor of a farmhouse, the team from the {uni} said on {fdate(d, 'dmy')}.",
        f"Dig leader {lead} said the hoard was probably hidden during a period of unrest.",
        f"The excavation has been running for {weeks} weeks and will end this month.",
        "The coins will be examined at the university before a decision is made about where they will be shown.",
        "Metal detecting in the area is banned.",
    ]
    r: list[Part] = [
        "A team from the ",
        g.ent(uni, "university"),
        " led by ",
        g.ent(lead, "person"),
        " found ",
        g.num(coins),
        " ",
        century,
        "-century silver coins in a clay pot near ",
        g.ent(town, "town"),
        g.add(
            detail=[" together with a gold ring"],
            baseless=[", likely the savings of a wealthy merchant"],
        ),
        ". The find was announced on ",
        g.when(d, "dmy"),
        ", after ",
        g.num(weeks),
        " weeks of digging, and metal detecting in the area ",
        g.flip("is banned", "is encouraged"),
        ".",
        g.add(
            detail=[" The coins are worth about 200,000 euros."],
            baseless=[" The hoard is the most important find in the region for decades."],
        ),
    ]
    return _doc(g, s, r, shuffle_tail=1)


def rocket_launch(g: Gen) -> Doc:
    """A rocket launch: time, date, satellites, mass, orbit, booster landing."""
    co = g.company()
    rocket = g.pick(("Kite", "Osprey", "Swift", "Bolide", "Heron")) + " " + str(g.int(1, 6))
    sats, km, kg = g.int(2, 24), g.int(40, 120) * 10, g.int(30, 400)
    d = g.date(2018, 2026)
    tm = g.time(5, 22)
    boss = g.person()
    landed = g.chance(0.5)
    s = [
        f"The {rocket} rocket built by {co} lifted off at {fdate(tm, 'time')} on {fdate(d, 'dmy')}.",
        f"It carried {sats} small weather satellites, each weighing about {kg} kilograms, into an orbit {km} kilometres above the Earth.",
        (
            "The first stage returned and landed on a barge at sea."
            if landed
            else "The first stage was not recovered and fell into the sea as planned."
        ),
        f"Launch director {boss} said all satellites were working.",
        "It was the company's third launch this year.",
        "Bad weather had delayed the launch by two days.",
    ]
    r: list[Part] = [
        "The ",
        rocket,
        " rocket built by ",
        g.ent(co, "company"),
        " lifted off at ",
        g.when(tm),
        " on ",
        g.when(d, "dmy"),
        " carrying ",
        g.num(sats),
        " weather satellites of about ",
        g.num(kg),
        " kilograms each to an orbit ",
        g.num(km),
        " kilometres up",
        g.add(
            detail=[" for a national weather agency"],
            baseless=[", proving the company can compete with larger rivals"],
        ),
        ". The first stage ",
        g.flip("landed on a barge at sea", "was lost")
        if landed
        else g.flip("was not recovered", "landed on a barge"),
        ", and ",
        g.ent(boss, "person"),
        " said all satellites were working.",
        g.add(
            detail=[" The next launch is planned within weeks."],
            baseless=[" The launch was a turning point for the company."],
        ),
    ]
    return _doc(g, s, r, shuffle_tail=2)


def food_inspection(g: Gen) -> Doc:
    """A restaurant closed by inspectors: date, fine, owner, reopening."""
    town = g.town()
    venue, owner, inspector = g.fresh("venue"), g.person(), g.person()
    fine, days = g.int(2, 40) * 250, g.int(3, 21)
    d = g.date(2016, 2025)
    s = [
        f"The restaurant {venue} in {town} was closed by food inspectors on {fdate(d, 'dmy')} after they found mice in the storeroom.",
        f"The owner, {owner}, was fined {fnum(fine, 'comma')} euros.",
        f"Inspector {inspector} said the kitchen itself was clean, but the storeroom had not been sealed.",
        f"The restaurant may reopen after {days} days if a second inspection is passed.",
        "No customers reported falling ill.",
        "The owner said pest control had been called in immediately.",
    ]
    r: list[Part] = [
        "Inspectors closed ",
        g.ent(venue, "venue"),
        " in ",
        g.ent(town, "town"),
        " on ",
        g.when(d, "dmy"),
        " after finding mice in the storeroom",
        g.add(detail=[" during a routine visit"], baseless=[", a sign of wider hygiene problems"]),
        ". Owner ",
        g.ent(owner, "person"),
        " was fined ",
        g.num(fine, "comma"),
        " euros; the kitchen ",
        g.flip("was found clean", "was also found dirty"),
        ", and it may reopen after ",
        g.num(days),
        " days if it passes a new inspection.",
        g.add(
            detail=[" It had passed its last inspection in the spring."],
            baseless=[" Bookings have dropped sharply since."],
        ),
    ]
    return _doc(g, s, r, shuffle_tail=2)


def housing_plan(g: Gen) -> Doc:
    """A housing approval: homes, developer, site, affordable share, start year."""
    town, dev, planner = g.town(), g.company(), g.person()
    homes, pct, ha = g.int(8, 90) * 10, g.int(15, 45), g.int(4, 40)
    y = g.int(2024, 2030)
    s = [
        f"Planners in {town} have approved {homes} new homes on a {ha}-hectare former airfield.",
        f"The developer, {dev}, must make {pct} percent of them affordable for local families.",
        f"Building will start in {y} and take about six years.",
        f"Chief planner {planner} said the site would also get a school and a health centre.",
        "Residents had raised concerns about traffic on the narrow access road.",
        "A new bus route will serve the estate.",
    ]
    r: list[Part] = [
        g.ent(town, "town"),
        " planners have approved ",
        g.num(homes),
        " homes by ",
        g.ent(dev, "company"),
        " on a ",
        g.num(ha),
        "-hectare former airfield, ",
        g.num(pct, hi=99),
        " percent of them affordable",
        g.add(
            detail=[", priced from 210,000 euros"],
            baseless=[", easing the town's housing shortage"],
        ),
        ". Building starts in ",
        g.when(y),
        ", and ",
        g.ent(planner, "person"),
        " said the site will ",
        g.flip("get", "not get"),
        " a school and a health centre.",
        g.add(
            detail=[" The access road will be widened."],
            baseless=[" Most residents support the plan."],
        ),
    ]
    return _doc(g, s, r, shuffle_tail=2)


def sea_rescue(g: Gen) -> Doc:
    """A sea rescue: crew, boat, date, distance offshore, duration, coxswain."""
    town, boat = g.town(), g.fresh("ship")
    crew, km, hours = g.int(3, 9), g.int(5, 60), g.int(2, 9)
    d = g.date(2012, 2025)
    coxswain = g.person()
    s = [
        f"All {crew} crew of the fishing boat {boat} were rescued on {fdate(d, 'wdm')} after the vessel took on water {km} kilometres off {town}.",
        f"The lifeboat from {town} reached them within an hour, and the operation took {hours} hours in heavy seas.",
        f"Coxswain {coxswain} said the crew had done everything right by putting on life jackets and calling for help early.",
        "One fisherman was treated in hospital for cold and released the same evening.",
        "The boat sank shortly after the rescue.",
        "The cause of the leak is being investigated.",
    ]
    r: list[Part] = [
        "All ",
        g.num(crew),
        " crew of the fishing boat ",
        g.ent(boat, "ship"),
        " were rescued on ",
        g.when(d, "wdm"),
        " when it took on water ",
        g.num(km),
        " km off ",
        g.ent(town, "town"),
        ". The ",
        g.num(hours),
        "-hour operation was led by coxswain ",
        g.ent(coxswain, "person"),
        g.add(
            detail=[" with help from a coastguard helicopter"],
            baseless=[", whose experience proved decisive"],
        ),
        "; the boat ",
        g.flip("sank", "was towed to harbour"),
        " shortly afterwards.",
        g.add(
            detail=[" The boat was 30 years old."], baseless=[" The crew were lucky to survive."]
        ),
    ]
    return _doc(g, s, r, shuffle_tail=2)


def library_grant(g: Gen) -> Doc:
    """A library grant: amount, funder, books, extra hours, start month."""
    town, fund, head = g.town(), g.fresh("foundation"), g.person()
    grant, books, hours = g.int(40, 900) * 1000, g.int(2, 30) * 1000, g.int(4, 20)
    d = g.date(2019, 2026)
    s = [
        f"The public library in {town} has received a grant of {fnum(grant, 'comma')} euros from {fund}.",
        f"The money will pay for {fnum(books, 'comma')} new books and longer opening hours from {fdate(d, 'month_year')}.",
        f"The library will open {hours} more hours a week, including Sunday afternoons.",
        f"Head librarian {head} said the children's section would be rebuilt first.",
        "Visitor numbers have doubled since the library began lending tools and games.",
        "The grant is the largest in the library's history.",
    ]
    r: list[Part] = [
        "The ",
        g.ent(town, "town"),
        " library received ",
        g.num(grant, "comma"),
        " euros from ",
        g.ent(fund, "foundation"),
        " for ",
        g.num(books, "comma"),
        " books and ",
        g.num(hours),
        " more opening hours a week from ",
        g.when(d, "month_year"),
        g.add(
            detail=[", when a new reading café also opens"],
            baseless=[", reflecting the town's growing population"],
        ),
        ". ",
        g.ent(head, "person"),
        " said the children's section will be rebuilt ",
        g.flip("first", "last"),
        ".",
        g.add(
            detail=[" The library also plans a mobile service for villages."],
            baseless=[" The grant should secure its future for years."],
        ),
    ]
    return _doc(g, s, r, shuffle_tail=2)


def tech_outage(g: Gen) -> Doc:
    """A payment outage: duration, start time, date, customers, shops, cause."""
    co, cto = g.company(), g.person()
    hours, users, shops = g.int(2, 14), g.real(0.2, 4.5), g.int(3, 60) * 100
    d = g.date(2018, 2026)
    tm = g.time(6, 20)
    s = [
        f"A payment service run by {co} failed for {hours} hours on {fdate(d, 'dmy')}, starting at {fdate(tm, 'time')}.",
        f"About {users:.1f} million customers could not pay by card, and {fnum(shops, 'comma')} shops had to accept cash only.",
        f"Technical director {cto} said a faulty software update had caused the failure, not a cyberattack.",
        "The company apologised and promised to refund any fees charged during the outage.",
        "The banking regulator has asked for a full report.",
    ]
    r: list[Part] = [
        "A payment service run by ",
        g.ent(co, "company"),
        " failed for ",
        g.num(hours),
        " hours from ",
        g.when(tm),
        " on ",
        g.when(d, "dmy"),
        ", leaving about ",
        g.num(users, "1f"),
        " million customers unable to pay by card and ",
        g.num(shops, "comma"),
        " shops taking cash only",
        g.add(
            detail=[", including two supermarket chains"],
            baseless=[", the most serious outage in its history"],
        ),
        ". ",
        g.ent(cto, "person"),
        " blamed a faulty update and said it ",
        g.flip("was not", "was"),
        " a cyberattack.",
        g.add(
            detail=[" The company will pay each shop 500 euros."],
            baseless=[" Customers are likely to switch providers."],
        ),
    ]
    return _doc(g, s, r, shuffle_tail=1)


TEMPLATES: dict[str, Callable[[Gen], Doc]] = {
    f.__name__: f
    for f in (
        bridge_reopens, acquisition, cup_final, fossil_find, storm, referendum, product_launch, art_theft,
        school_funding, fare_change, factory_closure, charity_run, wildlife_count, court_ruling, nurses_strike,
        festival_report, tourism_figures, archaeology_dig, rocket_launch, food_inspection, housing_plan,
        sea_rescue, library_grant, tech_outage,
    )
}  # fmt: skip
"""Summary templates by name (the build order)."""
